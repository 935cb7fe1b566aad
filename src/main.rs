//! relaylet's entry point: parses the command line and wires the parts together.

use std::process::ExitCode;

use relaylet::cli;
use relaylet::config::Config;

const USAGE: &str = "usage: relaylet [serve | check-config | join | unjoin | status | help]

  serve         (default) run as a virtual node's kubelet; configured by env vars (docs/install.md)
  check-config  validate the env vars and exit (0 when relaylet would start with them)
  join          register a leaf cluster and wait for its Node (relaylet join --help)
  unjoin        remove a leaf cluster and what relaylet made in it (relaylet unjoin --help)
  status        one line per registered leaf (relaylet status --help)

Installed as kubectl-relaylet on the PATH, the last three are `kubectl relaylet join ...`.
The sandbox and the benchmark are in the workspace's relaylet-dev crate (cargo run -p relaylet-dev).";

fn usage_of(command: &str) -> &'static str {
    match command {
        "join" => cli::join::USAGE,
        "unjoin" => cli::unjoin::USAGE,
        _ => cli::status::USAGE,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("relaylet: starting the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let rest = args.get(1..).unwrap_or_default();
    let help = rest.iter().any(|a| a == "-h" || a == "--help");
    let result = match args.first().map(String::as_str) {
        None | Some("serve") => runtime.block_on(relaylet::serve()),
        Some("check-config") => Config::from_env()
            .map(|config| {
                println!("configuration ok: {config:?}");
            })
            .map_err(anyhow::Error::from),
        Some(command @ ("join" | "unjoin" | "status")) if help => {
            println!("{}", usage_of(command));
            Ok(())
        }
        Some("join") => runtime.block_on(cli::join::run(rest)),
        Some("unjoin") => runtime.block_on(cli::unjoin::run(rest)),
        Some("status") => runtime.block_on(cli::status::run(rest)),
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
