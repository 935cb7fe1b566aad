//! relaylet's entry point: parses the command line and wires the parts together.

use std::process::ExitCode;

use relaylet::config::Config;

const USAGE: &str = "usage: relaylet [serve | check-config | check]

  serve         (default) run as a virtual node's kubelet; configured by env vars (docs/install.md)
  check-config  validate the env vars and exit (0 when relaylet would start with them)
  check         check an install from the root: pods Ready, each leaf's Node Ready (check --help)

The sandbox and the benchmark are in the workspace's relaylet-dev crate (cargo run -p relaylet-dev).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("relaylet: starting the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.first().map(String::as_str) {
        None | Some("serve") => runtime.block_on(relaylet::serve()),
        Some("check-config") => Config::from_env()
            .map(|config| {
                println!("configuration ok: {config:?}");
            })
            .map_err(anyhow::Error::from),
        Some("check") => runtime.block_on(relaylet::cli::check(&args[1..])),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("relaylet: {err:#}");
            ExitCode::FAILURE
        }
    }
}
