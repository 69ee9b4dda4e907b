//! How an instance with existing data becomes a standby of a (new) primary: follow it as is,
//! rewind it first (`pg_rewind`, when its timeline may have diverged), or discard it for a
//! fresh clone (when rewinding cannot work).
//!
//! Pure: the caller runs `pg_controldata` on the stopped data directory and `IDENTIFY_SYSTEM`
//! on the primary; this module parses their output and decides.

use crate::replication::status::Lsn;

/// `Database cluster state` in `pg_controldata`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterState {
    /// `shut down`: a primary stopped cleanly.
    ShutDown,
    /// `shut down in recovery`: a standby stopped cleanly.
    ShutDownInRecovery,
    /// `in archive recovery`: a standby that did not stop cleanly.
    InArchiveRecovery,
    /// `in production`: a primary that did not stop cleanly (or still runs).
    InProduction,
    /// Any other state (`starting up`, `shutting down`, `in crash recovery`).
    Other(String),
}

/// What `pg_controldata` says about a data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Control {
    pub system_identifier: u64,
    pub state: ClusterState,
    /// The newest timeline the control file knows of (the latest checkpoint's or the minimum
    /// recovery point's, whichever is higher).
    pub timeline: u32,
    pub data_checksums: bool,
    pub wal_log_hints: bool,
}

/// Parses `LC_ALL=C pg_controldata` output.
pub fn parse_controldata(output: &str) -> Result<Control, String> {
    let field = |name: &str| -> Option<&str> {
        output.lines().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    let need = |name: &str| field(name).ok_or_else(|| format!("pg_controldata has no {name:?}"));
    let number = |name: &str| -> Result<u64, String> {
        need(name)?
            .parse()
            .map_err(|_| format!("pg_controldata's {name:?} is not a number"))
    };
    let state = match need("Database cluster state")? {
        "shut down" => ClusterState::ShutDown,
        "shut down in recovery" => ClusterState::ShutDownInRecovery,
        "in archive recovery" => ClusterState::InArchiveRecovery,
        "in production" => ClusterState::InProduction,
        other => ClusterState::Other(other.to_string()),
    };
    let checkpoint_tli = number("Latest checkpoint's TimeLineID")?;
    let recovery_tli = number("Min recovery ending loc's timeline").unwrap_or(0);
    let timeline = u32::try_from(checkpoint_tli.max(recovery_tli))
        .map_err(|_| "pg_controldata's timeline is out of range".to_string())?;
    Ok(Control {
        system_identifier: number("Database system identifier")?,
        state,
        timeline,
        data_checksums: number("Data page checksum version")? != 0,
        wal_log_hints: need("wal_log_hints setting")? == "on",
    })
}

/// What the primary answers to `IDENTIFY_SYSTEM`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub system_identifier: u64,
    pub timeline: u32,
    pub wal_position: Lsn,
}

/// Parses the one row of `IDENTIFY_SYSTEM` as `psql -At -F '|'` prints it
/// (`systemid|timeline|xlogpos|dbname`).
pub fn parse_identify_system(output: &str) -> Result<Source, String> {
    let row = output
        .lines()
        .find(|l| !l.trim().is_empty())
        .ok_or("IDENTIFY_SYSTEM returned no row")?;
    let fields: Vec<&str> = row.split('|').collect();
    if fields.len() < 3 {
        return Err(format!(
            "IDENTIFY_SYSTEM returned {} fields, not 4",
            fields.len()
        ));
    }
    Ok(Source {
        system_identifier: fields[0]
            .trim()
            .parse()
            .map_err(|_| "IDENTIFY_SYSTEM's systemid is not a number")?,
        timeline: fields[1]
            .trim()
            .parse()
            .map_err(|_| "IDENTIFY_SYSTEM's timeline is not a number")?,
        wal_position: fields[2].trim().parse()?,
    })
}

/// What the local data directory is, as observed by the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Local {
    /// Missing or empty.
    Empty,
    /// PostgreSQL data of `major`, and what its control file says (`Err`: unreadable).
    Data {
        major: u32,
        control: Result<Control, String>,
    },
    /// Files that are not a PostgreSQL data directory.
    Foreign,
}

/// Why the data must be replaced by a fresh clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloneReason {
    /// Nothing to keep.
    Empty,
    Foreign,
    OtherMajor {
        found: u32,
        want: u32,
    },
    Unreadable(String),
    /// The data belongs to another cluster (another `initdb`).
    OtherCluster {
        local: u64,
        source: u64,
    },
    /// Rewinding needs data checksums or `wal_log_hints`, and the data has neither.
    NoHintBits,
    /// A rewind of this data was tried and failed (its data may be half-rewound), with what
    /// pg_rewind said then (kept beside the data directory, so a later start still says why).
    RewindFailed(String),
}

impl CloneReason {
    /// Whether the clone replaces data (the caller must allow discarding it).
    pub fn discards_data(&self) -> bool {
        !matches!(self, CloneReason::Empty)
    }

    pub fn message(&self) -> String {
        match self {
            CloneReason::Empty => "the data directory is empty".into(),
            CloneReason::Foreign => {
                "the data directory holds files that are not PostgreSQL data".into()
            }
            CloneReason::OtherMajor { found, want } => {
                format!("the data directory belongs to PostgreSQL {found}, the primary runs {want}")
            }
            CloneReason::Unreadable(why) => format!("the control file is unreadable: {why}"),
            CloneReason::OtherCluster { local, source } => format!(
                "the data belongs to another cluster (system identifier {local}, the primary's \
                 is {source})"
            ),
            CloneReason::NoHintBits => "pg_rewind cannot work: the data has neither data \
                                        checksums nor wal_log_hints"
                .into(),
            CloneReason::RewindFailed(why) if why.trim().is_empty() => {
                "a rewind of this data failed before (no reason was kept); it may be half-rewound"
                    .into()
            }
            CloneReason::RewindFailed(why) => format!(
                "a rewind of this data failed before ({}); it may be half-rewound",
                why.trim()
            ),
        }
    }
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejoin {
    /// Start as a standby of the source as the data is: it was a standby on the source's
    /// timeline, so nothing diverged.
    Follow,
    /// Run `pg_rewind` from the source first (it finds the divergence point, or says there is
    /// none), then start as a standby.
    Rewind,
    /// Replace the data with a fresh clone of the source.
    Clone(CloneReason),
}

/// Decides how the local data joins `source` as a standby. `rewind_failed`: an earlier rewind
/// of this data did not complete, and why.
pub fn decide(local: &Local, major: u32, source: &Source, rewind_failed: Option<&str>) -> Rejoin {
    let control = match local {
        Local::Empty => return Rejoin::Clone(CloneReason::Empty),
        Local::Foreign => return Rejoin::Clone(CloneReason::Foreign),
        Local::Data { major: found, .. } if *found != major => {
            return Rejoin::Clone(CloneReason::OtherMajor {
                found: *found,
                want: major,
            });
        }
        Local::Data {
            control: Err(why), ..
        } => return Rejoin::Clone(CloneReason::Unreadable(why.clone())),
        Local::Data {
            control: Ok(control),
            ..
        } => control,
    };
    if control.system_identifier != source.system_identifier {
        return Rejoin::Clone(CloneReason::OtherCluster {
            local: control.system_identifier,
            source: source.system_identifier,
        });
    }
    if let Some(why) = rewind_failed {
        return Rejoin::Clone(CloneReason::RewindFailed(why.to_string()));
    }
    let was_standby = matches!(
        control.state,
        ClusterState::ShutDownInRecovery | ClusterState::InArchiveRecovery
    );
    if was_standby && control.timeline == source.timeline {
        return Rejoin::Follow;
    }
    if !control.data_checksums && !control.wal_log_hints {
        return Rejoin::Clone(CloneReason::NoHintBits);
    }
    Rejoin::Rewind
}

/// Whether pg_rewind's report says "same timeline, no rewind required" while the source is
/// in fact on another timeline than the local data: the source's control file was stale (it
/// had not checkpointed since its promotion) and nothing was rewound.
pub fn stale_source_timeline(report: &str, local_timeline: u32, source_timeline: u32) -> bool {
    report.contains("are on the same timeline") && local_timeline != source_timeline
}

/// Whether pg_rewind's report says it began to rewind: until it says where it rewinds from, it
/// only ran the target's crash recovery and read both servers, and changed no file.
pub fn rewind_began(report: &str) -> bool {
    report.contains("rewinding from last common checkpoint")
}

/// Whether pg_rewind's report says it rewound something (not "no rewind required").
pub fn rewound(report: &str) -> bool {
    !report.contains("no rewind required")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTROLDATA: &str = "pg_control version number:            1300
Catalog version number:               202209061
Database system identifier:           7443256034573010485
Database cluster state:               shut down in recovery
pg_control last modified:             Tue 01 Dec 2026 09:40:00 AM UTC
Latest checkpoint location:           0/3000060
Latest checkpoint's REDO location:    0/3000028
Latest checkpoint's TimeLineID:       1
Latest checkpoint's PrevTimeLineID:   1
Minimum recovery ending location:     0/3000110
Min recovery ending loc's timeline:   2
wal_level setting:                    replica
wal_log_hints setting:                on
Data page checksum version:           1
";

    fn control(state: ClusterState, timeline: u32) -> Control {
        Control {
            system_identifier: 7,
            state,
            timeline,
            data_checksums: true,
            wal_log_hints: false,
        }
    }

    fn data(c: Control) -> Local {
        Local::Data {
            major: 15,
            control: Ok(c),
        }
    }

    fn source(timeline: u32) -> Source {
        Source {
            system_identifier: 7,
            timeline,
            wal_position: Lsn(0x3000000),
        }
    }

    #[test]
    fn parses_pg_controldata() {
        let c = parse_controldata(CONTROLDATA).unwrap();
        assert_eq!(
            c,
            Control {
                system_identifier: 7443256034573010485,
                state: ClusterState::ShutDownInRecovery,
                timeline: 2,
                data_checksums: true,
                wal_log_hints: true,
            }
        );
        let crashed = CONTROLDATA
            .replace("shut down in recovery", "in production")
            .replace(
                "Data page checksum version:           1",
                "Data page checksum version:           0",
            );
        let c = parse_controldata(&crashed).unwrap();
        assert_eq!(c.state, ClusterState::InProduction);
        assert!(!c.data_checksums);
        assert!(parse_controldata("garbage").is_err());
    }

    #[test]
    fn parses_identify_system() {
        assert_eq!(
            parse_identify_system("7443256034573010485|2|0/5000148|\n").unwrap(),
            Source {
                system_identifier: 7443256034573010485,
                timeline: 2,
                wal_position: Lsn(0x5000148),
            }
        );
        assert!(parse_identify_system("").is_err());
        assert!(parse_identify_system("x|2|0/1|").is_err());
    }

    #[test]
    fn decisions() {
        use ClusterState::*;
        let no_hints = Control {
            data_checksums: false,
            ..control(ShutDown, 1)
        };
        let hints_only = Control {
            wal_log_hints: true,
            ..no_hints.clone()
        };
        let other = Control {
            system_identifier: 8,
            ..control(ShutDownInRecovery, 2)
        };
        let table: Vec<(&str, Local, u32, Option<&str>, Rejoin)> = vec![
            (
                "standby on the source's timeline",
                data(control(ShutDownInRecovery, 2)),
                2,
                None,
                Rejoin::Follow,
            ),
            (
                "crashed standby on the source's timeline",
                data(control(InArchiveRecovery, 2)),
                2,
                None,
                Rejoin::Follow,
            ),
            (
                "standby of the old primary, new timeline",
                data(control(ShutDownInRecovery, 1)),
                2,
                None,
                Rejoin::Rewind,
            ),
            (
                "old primary, stopped cleanly",
                data(control(ShutDown, 1)),
                2,
                None,
                Rejoin::Rewind,
            ),
            (
                "old primary, crashed",
                data(control(InProduction, 1)),
                2,
                None,
                Rejoin::Rewind,
            ),
            (
                "old primary, same timeline",
                data(control(InProduction, 2)),
                2,
                None,
                Rejoin::Rewind,
            ),
            (
                "hint bits logged, no checksums",
                data(hints_only),
                2,
                None,
                Rejoin::Rewind,
            ),
            (
                "neither checksums nor hints",
                data(no_hints.clone()),
                2,
                None,
                Rejoin::Clone(CloneReason::NoHintBits),
            ),
            (
                "a standby needs no hint bits",
                data(Control {
                    state: ShutDownInRecovery,
                    timeline: 2,
                    ..no_hints
                }),
                2,
                None,
                Rejoin::Follow,
            ),
            (
                "rewind failed before",
                data(control(ShutDown, 1)),
                2,
                Some("pg_rewind failed (exit status: 1): could not find common ancestor"),
                Rejoin::Clone(CloneReason::RewindFailed(
                    "pg_rewind failed (exit status: 1): could not find common ancestor".into(),
                )),
            ),
            (
                "another cluster",
                data(other),
                2,
                None,
                Rejoin::Clone(CloneReason::OtherCluster {
                    local: 8,
                    source: 7,
                }),
            ),
            (
                "empty",
                Local::Empty,
                2,
                None,
                Rejoin::Clone(CloneReason::Empty),
            ),
            (
                "foreign",
                Local::Foreign,
                2,
                None,
                Rejoin::Clone(CloneReason::Foreign),
            ),
            (
                "another major",
                Local::Data {
                    major: 14,
                    control: Ok(control(ShutDown, 1)),
                },
                2,
                None,
                Rejoin::Clone(CloneReason::OtherMajor {
                    found: 14,
                    want: 15,
                }),
            ),
            (
                "unreadable control file",
                Local::Data {
                    major: 15,
                    control: Err("bad".into()),
                },
                2,
                None,
                Rejoin::Clone(CloneReason::Unreadable("bad".into())),
            ),
        ];
        for (name, local, tli, failed, want) in table {
            assert_eq!(decide(&local, 15, &source(tli), failed), want, "{name}");
        }
    }

    #[test]
    fn a_stale_source_timeline_is_noticed() {
        let same = "pg_rewind: source and target cluster are on the same timeline; \
                    pg_rewind: no rewind required";
        let diverged = "pg_rewind: servers diverged at WAL location 0/413CCA8 on timeline 1; \
                        pg_rewind: no rewind required";
        assert!(stale_source_timeline(same, 1, 2));
        assert!(!stale_source_timeline(same, 2, 2));
        assert!(!stale_source_timeline(diverged, 1, 2));
        assert!(!rewound(diverged) && !rewound(same));
        assert!(rewound(
            "pg_rewind: servers diverged at WAL location 0/413CCA8 on timeline 1; \
             pg_rewind: rewinding from last common checkpoint at 0/3000060 on timeline 1; \
             pg_rewind: Done!"
        ));
    }

    #[test]
    fn a_rewind_that_failed_before_it_began_changed_nothing() {
        let in_recovery = "pg_rewind: executing \"/usr/lib/postgresql/15/bin/postgres\" for \
                           target server to complete crash recovery; FATAL:  could not access \
                           file \"x\"; pg_rewind: error: postgres single-user mode in target \
                           cluster failed";
        let comparing = "pg_rewind: servers diverged at WAL location 0/413CCA8 on timeline 1; \
                         pg_rewind: error: could not open file \"pg_wal/000000010000000000000003\"";
        let copying = "pg_rewind: servers diverged at WAL location 0/413CCA8 on timeline 1; \
                       pg_rewind: rewinding from last common checkpoint at 0/3000060 on \
                       timeline 1; pg_rewind: error: could not write file: No space left";
        assert!(!rewind_began(in_recovery));
        assert!(!rewind_began(comparing));
        assert!(rewind_began(copying));
    }

    #[test]
    fn a_failed_rewind_says_why_it_failed() {
        let kept = CloneReason::RewindFailed("pg_rewind failed (exit status: 1): no route".into());
        assert_eq!(
            kept.message(),
            "a rewind of this data failed before (pg_rewind failed (exit status: 1): no route); \
             it may be half-rewound"
        );
        assert!(
            CloneReason::RewindFailed(" \n".into())
                .message()
                .contains("(no reason was kept)")
        );
    }

    #[test]
    fn only_an_empty_directory_is_cloned_without_discarding() {
        assert!(!CloneReason::Empty.discards_data());
        for reason in [
            CloneReason::Foreign,
            CloneReason::NoHintBits,
            CloneReason::RewindFailed(String::new()),
            CloneReason::OtherMajor {
                found: 14,
                want: 15,
            },
        ] {
            assert!(reason.discards_data(), "{reason:?}");
            assert!(!reason.message().is_empty());
        }
    }
}
