//! `kubectl dbop <TAB>`: kubectl's completion asks a plugin's words of an executable
//! `kubectl_complete-dbop`, with the words typed after `kubectl dbop` (the last one the word
//! being completed), and reads one candidate per line, then `:DIRECTIVE` (Cobra's protocol,
//! which kubectl speaks). Pure: the command tree and the words in, what to offer out; listing
//! the Databases a NAME may be is the binary's I/O.

use clap::{Arg, Command};

/// Cobra's directive "complete no file names" (ShellCompDirectiveNoFileComp): every word of
/// `kubectl dbop` is a command, a flag, a value or a Database, never a local file, except
/// `report -o` and `--kubeconfig`, which let the shell complete paths (directive 0).
pub const NO_FILE_COMPLETION: u32 = 4;
const FILE_COMPLETION: u32 = 0;

/// What to offer for the word being completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Offer {
    /// These words (already filtered by the typed prefix), with this directive.
    Words(Vec<String>, u32),
    /// The names of the Databases in the namespace that starts with `prefix`, as the words
    /// typed so far choose it (`-n`, `--context`, `--kubeconfig`).
    DatabaseNames { prefix: String, target: Target },
}

/// kubectl's flags among the words typed: they choose where Database names are listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub kubeconfig: Option<String>,
    pub context: Option<String>,
    pub namespace: Option<String>,
}

/// What to offer after `words` (the last one is being completed; it may be empty).
pub fn offer(root: &Command, words: &[String]) -> Offer {
    let mut root = root.clone();
    root.build();
    let (typed, current) = match words.split_last() {
        Some((current, typed)) => (typed, current.as_str()),
        None => (&[][..], ""),
    };
    let mut command = &root;
    let mut target = Target::default();
    let mut positionals = 0;
    let mut pending_value: Option<&Arg> = None;
    let mut after_dashes = false;
    for word in typed {
        if let Some(arg) = pending_value.take() {
            remember(&mut target, arg, word);
            continue;
        }
        if word == "--" {
            after_dashes = true;
        } else if after_dashes {
            positionals += 1;
        } else if let Some(arg) = flag(command, word) {
            if takes_value(arg) && !word.contains('=') {
                pending_value = Some(arg);
            } else if let Some((_, value)) = word.split_once('=') {
                remember(&mut target, arg, value);
            }
        } else if word.starts_with('-') {
            // An unknown flag: nothing is known about its value.
        } else if let Some(sub) = (std::ptr::eq(command, &root))
            .then(|| command.find_subcommand(word))
            .flatten()
        {
            command = sub;
        } else {
            positionals += 1;
        }
    }
    if after_dashes {
        return Offer::Words(Vec::new(), NO_FILE_COMPLETION);
    }
    if let Some(arg) = pending_value {
        return value_offer(arg, current);
    }
    if current.starts_with('-') {
        return Offer::Words(flag_words(command, current), NO_FILE_COMPLETION);
    }
    if std::ptr::eq(command, &root) {
        let words = command
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_string())
            .filter(|name| name.starts_with(current))
            .collect();
        return Offer::Words(words, NO_FILE_COMPLETION);
    }
    match command.get_positionals().nth(positionals) {
        Some(arg) if arg.get_id() == "name" => Offer::DatabaseNames {
            prefix: current.to_string(),
            target,
        },
        Some(arg) => value_offer(arg, current),
        None => Offer::Words(Vec::new(), NO_FILE_COMPLETION),
    }
}

/// The lines kubectl reads: the candidates, then `:DIRECTIVE`.
pub fn protocol_lines(words: &[String], directive: u32) -> String {
    let mut out = String::new();
    for word in words {
        out.push_str(word);
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    out
}

/// The names that start with `prefix`, sorted.
pub fn matching(names: impl IntoIterator<Item = String>, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// The flag a word names (`-n`, `--namespace`, `--namespace=x`), of the command or global.
fn flag<'a>(command: &'a Command, word: &str) -> Option<&'a Arg> {
    let name = word.split_once('=').map_or(word, |(n, _)| n);
    if let Some(long) = name.strip_prefix("--") {
        return command.get_arguments().find(|a| a.get_long() == Some(long));
    }
    let short = name.strip_prefix('-')?;
    let mut chars = short.chars();
    let (Some(c), None) = (chars.next(), chars.next()) else {
        return None;
    };
    command.get_arguments().find(|a| a.get_short() == Some(c))
}

fn takes_value(arg: &Arg) -> bool {
    arg.get_action().takes_values()
}

fn remember(target: &mut Target, arg: &Arg, value: &str) {
    let slot = match arg.get_id().as_str() {
        "kubeconfig" => &mut target.kubeconfig,
        "context" => &mut target.context,
        "namespace" => &mut target.namespace,
        _ => return,
    };
    *slot = Some(value.to_string());
}

/// A flag's or positional's value: its possible values when it has a closed set, else paths
/// for those that name one, else nothing.
fn value_offer(arg: &Arg, current: &str) -> Offer {
    let values: Vec<String> = arg
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .filter(|v| v.starts_with(current))
        .collect();
    let paths = matches!(
        arg.get_value_hint(),
        clap::ValueHint::AnyPath | clap::ValueHint::FilePath | clap::ValueHint::DirPath
    );
    let directive = if values.is_empty() && paths {
        FILE_COMPLETION
    } else {
        NO_FILE_COMPLETION
    };
    Offer::Words(values, directive)
}

/// The long flags of the command (its own and kubectl's) that start with `prefix`.
fn flag_words(command: &Command, prefix: &str) -> Vec<String> {
    let mut words: Vec<String> = command
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .map(|long| format!("--{long}"))
        .filter(|w| w.starts_with(prefix))
        .collect();
    words.sort();
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{ArgAction, value_parser};

    /// A tree shaped like kubectl-dbop's: kubectl's global flags, commands with a NAME.
    fn cli() -> Command {
        Command::new("kubectl-dbop")
            .arg(Arg::new("kubeconfig").long("kubeconfig").global(true))
            .arg(Arg::new("context").long("context").global(true))
            .arg(
                Arg::new("namespace")
                    .short('n')
                    .long("namespace")
                    .global(true),
            )
            .subcommand(
                Command::new("status").arg(Arg::new("name")).arg(
                    Arg::new("output")
                        .short('o')
                        .long("output")
                        .value_parser(["json", "yaml"]),
                ),
            )
            .subcommand(
                Command::new("list").arg(
                    Arg::new("all_namespaces")
                        .short('A')
                        .long("all-namespaces")
                        .action(ArgAction::SetTrue),
                ),
            )
            .subcommand(
                Command::new("report").arg(Arg::new("name")).arg(
                    Arg::new("output")
                        .short('o')
                        .long("output")
                        .value_parser(value_parser!(std::path::PathBuf)),
                ),
            )
            .subcommand(
                Command::new("psql")
                    .arg(Arg::new("name"))
                    .arg(Arg::new("args").last(true).num_args(0..)),
            )
            .subcommand(Command::new("hidden").hide(true))
    }

    fn words(line: &[&str]) -> Vec<String> {
        line.iter().map(|w| w.to_string()).collect()
    }

    fn offered(line: &[&str]) -> Vec<String> {
        match offer(&cli(), &words(line)) {
            Offer::Words(words, _) => words,
            other => panic!("{line:?}: {other:?}"),
        }
    }

    #[test]
    fn commands_first_filtered_by_what_is_typed() {
        assert_eq!(offered(&[""]), ["status", "list", "report", "psql", "help"]);
        assert_eq!(offered(&["st"]), ["status"]);
        assert_eq!(offered(&["-n", "shop", "l"]), ["list"]);
        assert_eq!(offered(&[]), ["status", "list", "report", "psql", "help"]);
    }

    #[test]
    fn flags_of_the_command_and_kubectl_s() {
        assert_eq!(
            offered(&["list", "--"]),
            [
                "--all-namespaces",
                "--context",
                "--help",
                "--kubeconfig",
                "--namespace"
            ]
        );
        assert_eq!(offered(&["status", "x", "--o"]), ["--output"]);
    }

    #[test]
    fn a_flag_s_closed_values() {
        assert_eq!(offered(&["status", "x", "-o", ""]), ["json", "yaml"]);
        assert_eq!(offered(&["status", "x", "--output", "j"]), ["json"]);
    }

    #[test]
    fn a_name_is_a_database_in_the_namespace_the_flags_choose() {
        let line = words(&[
            "--context",
            "prod",
            "status",
            "--namespace=shop",
            "--kubeconfig",
            "/k",
            "or",
        ]);
        assert_eq!(
            offer(&cli(), &line),
            Offer::DatabaseNames {
                prefix: "or".into(),
                target: Target {
                    kubeconfig: Some("/k".into()),
                    context: Some("prod".into()),
                    namespace: Some("shop".into()),
                },
            }
        );
        // A flag's value is not the NAME: after `-n shop` the NAME is still to come.
        assert!(matches!(
            offer(&cli(), &words(&["status", "-n", "shop", ""])),
            Offer::DatabaseNames { .. }
        ));
        // The NAME given: nothing more to complete.
        assert_eq!(offered(&["status", "orders", ""]), Vec::<String>::new());
    }

    #[test]
    fn paths_only_where_a_path_is_asked_and_nothing_after_dashes() {
        let report = offer(&cli(), &words(&["report", "orders", "-o", ""]));
        assert_eq!(report, Offer::Words(Vec::new(), FILE_COMPLETION));
        let psql = offer(&cli(), &words(&["psql", "orders", "--", "-c"]));
        assert_eq!(psql, Offer::Words(Vec::new(), NO_FILE_COMPLETION));
    }

    #[test]
    fn kubectl_reads_one_word_a_line_then_the_directive() {
        assert_eq!(
            protocol_lines(&words(&["orders", "shop"]), NO_FILE_COMPLETION),
            "orders\nshop\n:4\n"
        );
        assert_eq!(protocol_lines(&[], 0), ":0\n");
        assert_eq!(
            matching(words(&["shop", "orders", "ops"]), "o"),
            ["ops", "orders"]
        );
    }
}
