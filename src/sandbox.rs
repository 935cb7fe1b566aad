//! The local sandbox: simulated root and leaf clusters with the real relaylet between them.

use std::path::PathBuf;

/// Command-line options of `relaylet sandbox`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where to write the root cluster's kubeconfig.
    pub kubeconfig_out: Option<PathBuf>,
}

impl Options {
    pub fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--kubeconfig-out" => {
                    let path = args
                        .next()
                        .ok_or_else(|| anyhow::anyhow!("--kubeconfig-out needs a path"))?;
                    options.kubeconfig_out = Some(path.into());
                }
                other => anyhow::bail!("unknown sandbox option {other:?}"),
            }
        }
        Ok(options)
    }
}

/// Runs the sandbox until Ctrl-C.
pub async fn run(_options: Options) -> anyhow::Result<()> {
    anyhow::bail!("the sandbox is not ready yet: it lands with the relay issue")
}
