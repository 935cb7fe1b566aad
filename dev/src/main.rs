//! `relaylet-dev`: the sandbox and the benchmark on the command line.

use std::process::ExitCode;

const USAGE: &str = "usage: relaylet-dev [sandbox [--kubeconfig-out PATH] | bench [--quick] [--json] [--only bulk,rtt,setup,memory,proxy,fleet,kubelet-path] [--leaves N] [--idle-minutes M]]

  sandbox  start simulated root and leaf clusters with relaylet between them, for your kubectl
  bench    measure relaylet against the direct path, a bare reference relay and the floor (see docs/performance.md)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("relaylet-dev: starting the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.first().map(String::as_str) {
        Some("sandbox") => runtime.block_on(sandbox(&args[1..])),
        Some("bench") => runtime.block_on(bench(&args[1..])),
        // Hidden, started by `bench` as processes of their own: relaylet as `relaylet serve`
        // runs it (the same library call), and the benchmark's reference relay.
        Some("serve") => runtime.block_on(relaylet::serve()),
        Some("bench-relay") => runtime.block_on(bench_relay(&args[1..])),
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("relaylet-dev: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn sandbox(args: &[String]) -> anyhow::Result<()> {
    relaylet::ops::telemetry::init(relaylet::config::LogFormat::Text);
    let options = relaylet_dev::sandbox::Options::parse(args)?;
    if options.help {
        println!("{}", relaylet_dev::sandbox::SANDBOX_USAGE);
        return Ok(());
    }
    relaylet_dev::sandbox::run(options).await
}

async fn bench(args: &[String]) -> anyhow::Result<()> {
    let options = relaylet_dev::bench::Options::parse(args)?;
    relaylet_dev::bench::run(options).await
}

async fn bench_relay(args: &[String]) -> anyhow::Result<()> {
    let args = relaylet_dev::bench::reference_relay::RelayArgs::parse(args)?;
    relaylet_dev::bench::reference_relay::run(args).await
}
