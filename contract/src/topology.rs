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
//! ```
//!
//! Unknown keys are ignored (a newer operator may add some). Pure: no I/O.

/// The file of `instance::CONFIG_DIR` with the topology.
pub const TOPOLOGY_FILE: &str = "topology";
/// Where the operator mounts the replication role's credentials (the Secret
/// `<name>-replication`), and the file in it with the password.
pub const REPLICATION_DIR: &str = "/etc/dbop/replication";
pub const REPLICATION_PASSWORD_FILE: &str = "password";

/// One instance: its name (the pod's) and the address its peers reach it at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub host: String,
    pub port: u16,
}

/// The instances of a Database and its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// The instance that runs as the primary (a member's name).
    pub primary: String,
    /// Every instance, the primary among them, in ordinal order.
    pub members: Vec<Member>,
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
        text
    }

    /// Reads the file's text; an error says which line is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut primary = None;
        let mut members = Vec::new();
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
                _ => {}
            }
        }
        let primary = primary
            .filter(|p| !p.is_empty())
            .ok_or("topology: no primary")?;
        let topology = Self { primary, members };
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
        }
    }

    #[test]
    fn the_text_reads_back_as_it_was_written() {
        let t = three();
        assert_eq!(Topology::parse(&t.render()), Ok(t.clone()));
        assert_eq!(t.standbys(), vec!["db-0".to_string(), "db-2".to_string()]);
        assert_eq!(t.role_of("db-1"), Some(Role::Primary));
        assert_eq!(t.role_of("db-2"), Some(Role::Standby));
        assert_eq!(t.role_of("db-9"), None);
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
