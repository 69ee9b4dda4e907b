//! The kubectl the plugin runs (`psql`, `logs`, `reload`): the global flags it was given are
//! passed on, so it talks to the same cluster as the plugin. Pure.

/// `--kubeconfig` and `--context` as the plugin got them (the namespace goes as `-n` with each
/// command).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Global {
    pub kubeconfig: Option<String>,
    pub context: Option<String>,
}

impl Global {
    /// The kubectl arguments for `command`: the global flags first.
    pub fn command(&self, command: Vec<String>) -> Vec<String> {
        let mut args = vec![];
        if let Some(file) = &self.kubeconfig {
            args.push(format!("--kubeconfig={file}"));
        }
        if let Some(context) = &self.context {
            args.push(format!("--context={context}"));
        }
        args.extend(command);
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_flags_go_before_the_command() {
        let command = vec!["logs".to_string(), "orders-0".into()];
        assert_eq!(Global::default().command(command.clone()), command);
        let global = Global {
            kubeconfig: Some("/tmp/kc".into()),
            context: Some("prod".into()),
        };
        assert_eq!(
            global.command(command).join(" "),
            "--kubeconfig=/tmp/kc --context=prod logs orders-0"
        );
    }
}
