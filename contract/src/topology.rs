//! The Database's topology as the operator publishes it to its instances: which instances
//! exist, how each is reached, and which one is the primary. The operator writes it into the
//! server configuration ConfigMap (`instance::CONFIG_DIR`/`TOPOLOGY_FILE`); each instance
//! manager reads it to know whether it runs as the primary or as a standby, where its
//! primary is, and (on the primary) which standbys get a replication slot.
//!
//! A line format, so a person reading the ConfigMap sees it at once:
//!
//! ```text
//! # Written by dbop: ...
//! primary=orders-0
//! instance=orders-0 orders-0.orders-hl.shop.svc 5432
//! instance=orders-1 orders-1.orders-hl.shop.svc 5432
//! synchronous=1 wait
//! ```
//!
//! `synchronous=N wait|degrade` (only with `spec.synchronous`): the primary has every commit
//! confirmed by N standbys before it is acknowledged; with fewer streaming, it waits, or
//! degrades to the ones that stream (none: asynchronous).
//!
//! Unknown keys are ignored (a newer operator may add some). Pure: no I/O.

/// The file of `instance::CONFIG_DIR` with the topology.
pub const TOPOLOGY_FILE: &str = "topology";
/// Where the operator mounts the replication role's credentials (the Secret
/// `<name>-replication`), and the file in it with the password.
pub const REPLICATION_DIR: &str = "/etc/dbop/replication";
/// The role standbys (and physical backups) connect as: LOGIN REPLICATION, not a superuser;
/// the primary's instance manager gives it the mounted password.
pub const REPLICATION_ROLE: &str = "dbop_replication";
pub const REPLICATION_PASSWORD_FILE: &str = "password";

/// One instance: its name (the pod's) and the address its peers reach it at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub host: String,
    pub port: u16,
}

/// Synchronous replication, as the primary applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synchronous {
    /// How many standbys confirm each commit.
    pub standbys: u32,
    /// With fewer streaming: commits wait (`true`), or are confirmed by those that stream.
    pub wait: bool,
}

impl Synchronous {
    /// `synchronous_standby_names` for a primary whose standbys are `standbys` (the
    /// topology's, in order) of which `streaming` stream now: a quorum (`ANY n`) of every
    /// standby when it waits; of the streaming ones when it degrades, and nothing (asynchronous)
    /// when none streams.
    pub fn standby_names(&self, standbys: &[String], streaming: &[String]) -> String {
        let (n, names): (u32, Vec<&String>) = if self.wait {
            (self.standbys, standbys.iter().collect())
        } else {
            let names: Vec<&String> = standbys.iter().filter(|s| streaming.contains(s)).collect();
            (self.standbys.min(names.len() as u32), names)
        };
        if n == 0 || names.is_empty() {
            return String::new();
        }
        let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        format!("ANY {n} ({})", quoted.join(", "))
    }
}

/// The instances of a Database and its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// The instance that runs as the primary (a member's name).
    pub primary: String,
    /// Every instance, the primary among them, in ordinal order.
    pub members: Vec<Member>,
    /// Synchronous replication (`None`: asynchronous).
    pub synchronous: Option<Synchronous>,
}

impl Topology {
    /// The file's text.
    pub fn render(&self) -> String {
        let mut text = String::from(
            "# Written by dbop: the Database's instances and its primary. Edits are undone.\n",
        );
        text.push_str(&format!("primary={}\n", self.primary));
        for m in &self.members {
            text.push_str(&format!("instance={} {} {}\n", m.name, m.host, m.port));
        }
        if let Some(sync) = self.synchronous {
            let when = if sync.wait { "wait" } else { "degrade" };
            text.push_str(&format!("synchronous={} {when}\n", sync.standbys));
        }
        text
    }

    /// Reads the file's text; an error says which line is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut primary = None;
        let mut members = Vec::new();
        let mut synchronous = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(format!("topology line {}: no '=' in {line:?}", n + 1));
            };
            match key.trim() {
                "primary" => primary = Some(value.trim().to_string()),
                "instance" => {
                    let mut parts = value.split_whitespace();
                    let port = |p: &str| p.parse::<u16>().ok();
                    match (
                        parts.next(),
                        parts.next(),
                        parts.next().and_then(port),
                        parts.next(),
                    ) {
                        (Some(name), Some(host), Some(port), None) => members.push(Member {
                            name: name.into(),
                            host: host.into(),
                            port,
                        }),
                        _ => {
                            return Err(format!(
                                "topology line {}: an instance is 'NAME HOST PORT', not {value:?}",
                                n + 1
                            ));
                        }
                    }
                }
                "synchronous" => {
                    let mut parts = value.split_whitespace();
                    let standbys = parts.next().and_then(|n| n.parse::<u32>().ok());
                    let wait = match parts.next() {
                        Some("wait") => Some(true),
                        Some("degrade") => Some(false),
                        _ => None,
                    };
                    match (standbys, wait, parts.next()) {
                        (Some(standbys), Some(wait), None) if standbys > 0 => {
                            synchronous = Some(Synchronous { standbys, wait })
                        }
                        _ => {
                            return Err(format!(
                                "topology line {}: synchronous is 'N wait|degrade', not {value:?}",
                                n + 1
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        let primary = primary
            .filter(|p| !p.is_empty())
            .ok_or("topology: no primary")?;
        let topology = Self {
            primary,
            members,
            synchronous,
        };
        if topology.member(&topology.primary).is_none() {
            return Err(format!(
                "topology: the primary {} is not one of its instances",
                topology.primary
            ));
        }
        Ok(topology)
    }

    /// The member named `name`.
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The primary's member entry (`parse` made sure it exists).
    pub fn primary_member(&self) -> Option<&Member> {
        self.member(&self.primary)
    }

    /// The names of every instance but the primary: the standbys, each with a slot.
    pub fn standbys(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.name != self.primary)
            .map(|m| m.name.clone())
            .collect()
    }

    /// The role `name` has in it: `None` when it is not one of its instances.
    pub fn role_of(&self, name: &str) -> Option<Role> {
        self.member(name).map(|_| {
            if name == self.primary {
                Role::Primary
            } else {
                Role::Standby
            }
        })
    }
}

/// What an instance is told to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Standby,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Topology {
        Topology {
            primary: "db-1".into(),
            members: (0..3)
                .map(|i| Member {
                    name: format!("db-{i}"),
                    host: format!("db-{i}.db-hl.ns.svc"),
                    port: 5432,
                })
                .collect(),
            synchronous: None,
        }
    }

    #[test]
    fn the_text_reads_back_as_it_was_written() {
        let t = three();
        assert_eq!(Topology::parse(&t.render()), Ok(t.clone()));
        for wait in [true, false] {
            let sync = Topology {
                synchronous: Some(Synchronous { standbys: 2, wait }),
                ..three()
            };
            assert_eq!(Topology::parse(&sync.render()), Ok(sync.clone()));
        }
        assert_eq!(t.standbys(), vec!["db-0".to_string(), "db-2".to_string()]);
        assert_eq!(t.role_of("db-1"), Some(Role::Primary));
        assert_eq!(t.role_of("db-2"), Some(Role::Standby));
        assert_eq!(t.role_of("db-9"), None);
    }

    #[test]
    fn synchronous_standby_names_wait_for_a_quorum_of_all_or_degrade_to_those_streaming() {
        let standbys = ["db-0".to_string(), "db-2".to_string()];
        let wait = Synchronous {
            standbys: 1,
            wait: true,
        };
        let degrade = Synchronous {
            wait: false,
            ..wait
        };
        let table = [
            (
                wait,
                &standbys[..],
                &standbys[..1],
                "ANY 1 (\"db-0\", \"db-2\")",
            ),
            (wait, &standbys[..], &[][..], "ANY 1 (\"db-0\", \"db-2\")"),
            (
                degrade,
                &standbys[..],
                &standbys[..],
                "ANY 1 (\"db-0\", \"db-2\")",
            ),
            (degrade, &standbys[..], &standbys[1..], "ANY 1 (\"db-2\")"),
            (degrade, &standbys[..], &[][..], ""),
            (wait, &[][..], &[][..], ""),
        ];
        for (sync, all, streaming, want) in table {
            assert_eq!(
                sync.standby_names(all, streaming),
                want,
                "{sync:?} {streaming:?}"
            );
        }
        let two = Synchronous {
            standbys: 2,
            wait: false,
        };
        assert_eq!(
            two.standby_names(&standbys, &standbys[..1]),
            "ANY 1 (\"db-0\")"
        );
        for bad in [
            "synchronous=0 wait",
            "synchronous=1",
            "synchronous=1 maybe",
            "synchronous=x wait",
            "synchronous=1 wait more",
        ] {
            let text = format!("primary=a\ninstance=a a.h 5432\n{bad}\n");
            assert!(
                Topology::parse(&text).unwrap_err().contains("line 3"),
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_ignored_and_bad_lines_named() {
        let text = "future=1\nprimary=a\ninstance=a a.h 5432\n";
        assert_eq!(Topology::parse(text).unwrap().primary, "a");
        assert!(
            Topology::parse("primary=a\n")
                .unwrap_err()
                .contains("not one of")
        );
        assert!(
            Topology::parse("instance=a a.h 1\n")
                .unwrap_err()
                .contains("no primary")
        );
        assert!(
            Topology::parse("primary=a\ninstance=a a.h\n")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(
            Topology::parse("primary=a\ninstance=a a.h x\n")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(
            Topology::parse("primary a\n")
                .unwrap_err()
                .contains("line 1")
        );
    }
}
