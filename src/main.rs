//! relaylet's entry point: parses the command line and wires the parts together.

use std::process::ExitCode;

use relaylet::config::{Config, LogFormat};
use relaylet::shutdown::Shutdown;

const USAGE: &str = "usage: relaylet [serve | check-config | sandbox [--kubeconfig-out PATH] | bench [--quick] [--json] [--only bulk,rtt,setup,memory]]

  serve         (default) run as a virtual node's kubelet; configured by env vars (see README)
  check-config  validate the env vars and exit (0 when relaylet would start with them)
  sandbox       start simulated root and leaf clusters with relaylet between them, for your kubectl
  bench         measure relaylet against the direct path and a bare reference relay (see the README, Performance)";

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
        None | Some("serve") => runtime.block_on(serve()),
        Some("sandbox") => runtime.block_on(sandbox(&args[1..])),
        Some("bench") => runtime.block_on(bench(&args[1..])),
        // Hidden: the benchmark's reference relay, started by `bench` as its own process.
        Some("bench-relay") => runtime.block_on(bench_relay(&args[1..])),
        Some("check-config") => Config::from_env()
            .map(|config| {
                println!("configuration ok: {config:?}");
            })
            .map_err(anyhow::Error::from),
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

async fn serve() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    relaylet::telemetry::init(config.log_format);
    let root = kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!("connecting to the root cluster (KUBECONFIG or in-cluster): {e}")
    })?;
    let shutdown = Shutdown::default();
    shutdown.on_signals(config.shutdown_grace_period);
    let running = relaylet::start(config, root, shutdown).await?;
    running.server.await?;
    Ok(())
}

#[cfg(feature = "sim")]
async fn sandbox(args: &[String]) -> anyhow::Result<()> {
    relaylet::telemetry::init(LogFormat::Text);
    let options = relaylet::sandbox::Options::parse(args)?;
    if options.help {
        println!("{}", relaylet::sandbox::SANDBOX_USAGE);
        return Ok(());
    }
    relaylet::sandbox::run(options).await
}

#[cfg(not(feature = "sim"))]
async fn sandbox(_args: &[String]) -> anyhow::Result<()> {
    let _ = LogFormat::Text;
    anyhow::bail!("this build has no sandbox (built without the `sim` feature)")
}

#[cfg(feature = "sim")]
async fn bench(args: &[String]) -> anyhow::Result<()> {
    let options = relaylet::bench::Options::parse(args)?;
    relaylet::bench::run(options).await
}

#[cfg(feature = "sim")]
async fn bench_relay(args: &[String]) -> anyhow::Result<()> {
    let args = relaylet::bench::reference_relay::RelayArgs::parse(args)?;
    relaylet::bench::reference_relay::run(args).await
}

#[cfg(not(feature = "sim"))]
async fn bench(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("this build has no benchmark (built without the `sim` feature)")
}

#[cfg(not(feature = "sim"))]
async fn bench_relay(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("this build has no benchmark (built without the `sim` feature)")
}
