//! `relaylet-dev bench`: what relaylet costs against the direct path and the physical limit.
//!
//! Starts the stand-ins, relaylet and a bare reference relay on loopback (see [`stack`]) and
//! measures every figure three ways in the same run, interleaved repetition by repetition:
//! `direct` (client to the leaf apiserver), `limit` (through the reference relay: one extra
//! TLS hop and one copy, nothing else) and `relayed` (through relaylet's kubelet API, as the
//! root apiserver calls it). Medians of several repetitions are reported, with
//! `ratio = relayed / limit` for throughputs and rates and `limit / relayed` for latencies and
//! CPU cost. Memory and descriptor figures are relaylet's own, read from `/proc`.

mod client;
pub mod fleet;
mod floor;
mod hold;
pub mod kubelet_path;
mod node_view;
pub mod pod_sync;
mod procfs;
pub mod reference_relay;
mod report;
mod sockets;
mod stack;

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;

pub use report::{Figure, median, percentile};

use client::{Route, Transfer};
use report::Better;
use stack::Stack;

/// Command-line options of `relaylet-dev bench`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// A short run (well under three minutes).
    pub quick: bool,
    /// One JSON object per figure and line instead of a table.
    pub json: bool,
    /// Tiny sizes, for the smoke test: every figure, measured on almost nothing.
    pub smoke: bool,
    /// Only these groups of figures (`--only bulk,rtt,setup,memory,proxy`); all when empty.
    pub only: Groups,
    /// The fleet's number of leaves (`--leaves N`, 10 leaf pods each).
    pub leaves: Option<usize>,
    /// The fleet's idle at the end, minutes (`--idle-minutes M`; 10 unless set).
    pub idle_minutes: Option<u64>,
}

/// Which groups of figures to measure: handy while tuning one path.
#[derive(Debug, Clone, Copy, Default)]
pub struct Groups {
    /// Throughputs of exec stdout, port-forward and `logs -f`, and the CPU cost per GiB.
    pub bulk: bool,
    /// Interactive round trips.
    pub rtt: bool,
    /// Session setup rate.
    pub setup: bool,
    /// Memory per idle session and what is left after they close.
    pub memory: bool,
    /// relaylet reaching the leaf through an HTTP CONNECT proxy against relaylet dialling it:
    /// exec throughput, round trip and setup rate.
    pub proxy: bool,
    /// relaylet against a fleet of leaves (`fleet`); only when asked for by name.
    pub fleet: bool,
    /// CPU per GiB of every process on the path of real Kubernetes 1.37 with and without
    /// `ExtendWebSocketsToKubelet` declared (`kubelet-path`); only when asked for by name.
    pub kubelet_path: bool,
    /// Pods run through relaylet's pod sync against the same pods run in the leaf directly
    /// (`podsync`); only when asked for by name.
    pub pod_sync: bool,
}

impl Groups {
    const ALL: Groups = Groups {
        bulk: true,
        rtt: true,
        setup: true,
        memory: true,
        proxy: true,
        fleet: false,
        kubelet_path: false,
        pod_sync: false,
    };

    fn parse(list: &str) -> anyhow::Result<Groups> {
        let mut groups = Groups::default();
        for name in list.split(',') {
            match name {
                "bulk" => groups.bulk = true,
                "rtt" => groups.rtt = true,
                "setup" => groups.setup = true,
                "memory" => groups.memory = true,
                "proxy" => groups.proxy = true,
                "fleet" => groups.fleet = true,
                "kubelet-path" => groups.kubelet_path = true,
                "podsync" => groups.pod_sync = true,
                other => {
                    anyhow::bail!(
                        "unknown figure group {other:?} (try bulk, rtt, setup, memory, proxy, fleet, kubelet-path, podsync)"
                    )
                }
            }
        }
        Ok(groups)
    }

    fn any(&self) -> bool {
        self.data_path() || self.fleet || self.kubelet_path || self.pod_sync
    }

    /// Whether any figure of the data path (the stack of one leaf) is asked for.
    fn data_path(&self) -> bool {
        self.bulk || self.rtt || self.setup || self.memory || self.proxy
    }
}

impl Options {
    pub fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--json" => options.json = true,
                "--smoke" => options.smoke = true,
                "--only" => {
                    let list = args
                        .next()
                        .context("--only needs a list, e.g. --only setup")?;
                    options.only = Groups::parse(list)?;
                }
                "--leaves" => options.leaves = Some(positive(args.next(), "--leaves")?),
                "--idle-minutes" => {
                    options.idle_minutes = Some(positive(args.next(), "--idle-minutes")?);
                }
                other => anyhow::bail!(
                    "unknown bench option {other:?} (try --quick, --json, --only GROUPS, --leaves N, --idle-minutes M)"
                ),
            }
        }
        if !options.only.any() {
            options.only = Groups::ALL;
        }
        Ok(options)
    }
}

/// The value of a numeric option: a whole number above zero.
fn positive<T: std::str::FromStr + PartialOrd + Default>(
    value: Option<&String>,
    option: &str,
) -> anyhow::Result<T> {
    let value = value.with_context(|| format!("{option} needs a number, e.g. {option} 100"))?;
    match value.parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => anyhow::bail!("{option} needs a whole number above zero, not {value:?}"),
    }
}

/// How much each figure measures.
#[derive(Debug, Clone)]
struct Sizes {
    /// Repetitions of each figure per route.
    reps: usize,
    /// Bytes per exec stdout and port-forward sample.
    stream_bytes: u64,
    /// Bytes per `logs -f` sample (the log container writes this much). A multiple of the
    /// 100-byte log line: an unterminated last line would stay buffered as a partial record.
    log_bytes: u64,
    /// Round trips per latency sample.
    round_trips: usize,
    /// Sessions per setup-rate sample.
    setups: usize,
    /// Concurrent idle sessions for the memory figure.
    idle_sessions: Vec<usize>,
}

impl Sizes {
    fn for_options(options: &Options, fd_limit: u64) -> Sizes {
        // relaylet holds two descriptors per session (caller and leaf), and so does the bench
        // (client and hold endpoint). Keep 1,000 spare for everything else.
        let fit = usize::try_from(fd_limit.saturating_sub(1000) / 2).unwrap_or(usize::MAX);
        let idle = |n: usize| n.min(fit);
        const MIB: u64 = 1024 * 1024;
        if options.smoke {
            Sizes {
                reps: 1,
                stream_bytes: MIB,
                log_bytes: 1_000_000,
                round_trips: 20,
                setups: 3,
                idle_sessions: vec![idle(20)],
            }
        } else if options.quick {
            Sizes {
                reps: 3,
                stream_bytes: 32 * MIB,
                log_bytes: 32_000_000,
                round_trips: 500,
                setups: 20,
                idle_sessions: vec![idle(1_000), idle(10_000)],
            }
        } else {
            // On a shared 2-core machine a single sample can be off by 10%; 15 repetitions
            // keep the medians (and so the ratios) steady from run to run.
            Sizes {
                reps: 15,
                stream_bytes: 256 * MIB,
                log_bytes: 128_000_000,
                round_trips: 3_000,
                setups: 100,
                idle_sessions: vec![idle(1_000), idle(10_000)],
            }
        }
    }
}

/// Raises the descriptor soft limit to the hard limit (children inherit it); returns it.
fn raise_fd_limit() -> anyhow::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("reading RLIMIT_NOFILE")?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).context("raising RLIMIT_NOFILE")?;
    Ok(hard)
}

/// Runs the benchmark and prints its figures.
pub async fn run(options: Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let fd_limit = raise_fd_limit()?;
    let sizes = Sizes::for_options(&options, fd_limit);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let header = format!(
        "relaylet-dev bench: {cores} cores, fd limit {fd_limit}, {} mode, {} repetitions per figure and route",
        if options.smoke {
            "smoke"
        } else if options.quick {
            "quick"
        } else {
            "full"
        },
        sizes.reps
    );
    eprintln!("{header}");
    if options.only.kubelet_path {
        run_kubelet_path(options).await?;
    }
    if options.only.fleet {
        run_fleet(options).await?;
    }
    if options.only.pod_sync {
        run_pod_sync(options).await?;
    }
    if !options.only.data_path() {
        eprintln!("bench finished in {:.0?}", started.elapsed());
        return Ok(());
    }
    let stack = Stack::start(sizes.log_bytes)
        .await
        .context("starting the benchmark stack")?;
    let result = measure(&stack, &sizes, options).await;
    stack.stop().await;
    let figures = result?;
    let targets = report::targets(&figures);
    if options.json {
        for target in &targets {
            eprintln!("target {target}");
        }
    } else {
        println!("{header}\n");
        println!("{}", report::table(&figures));
        println!("Targets:");
        for target in &targets {
            println!("- {target}");
        }
    }
    eprintln!("bench finished in {:.0?}", started.elapsed());
    Ok(())
}

/// The kubelet-path figures (`--only kubelet-path`): a table of CPU s/GiB per process and
/// throughput, medians of the rounds. Real Kubernetes is blocking test equipment with its own
/// runtime, so it runs on a thread of its own.
async fn run_kubelet_path(options: Options) -> anyhow::Result<()> {
    let (rounds, bytes) = if options.smoke {
        (1, 20_000_000)
    } else if options.quick {
        (1, 100_000_000)
    } else {
        (3, 400_000_000)
    };
    eprintln!(
        "kubelet-path: {rounds} round(s) of {bytes} B of kubectl exec stdout per combination"
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(kubelet_path::run(rounds, bytes));
    });
    let rows = rx
        .await
        .context("the kubelet-path run panicked (its message is above)")??;
    let yes_no = |b: bool| if b { "declared" } else { "not declared" };
    if options.json {
        for r in &rows {
            for (i, process) in kubelet_path::PROCESSES.iter().enumerate() {
                let samples: Vec<f64> = r.cpu_per_gib.iter().map(|s| s[i]).collect();
                println!(
                    "{}",
                    serde_json::json!({"relaylet": yes_no(r.relaylet_declares), "leaf_kubelet": yes_no(r.kubelet_declares), "process": process, "cpu_s_per_gib": report::median(&samples), "samples": samples})
                );
            }
            println!(
                "{}",
                serde_json::json!({"relaylet": yes_no(r.relaylet_declares), "leaf_kubelet": yes_no(r.kubelet_declares), "throughput_mib_s": report::median(&r.throughput), "samples": r.throughput})
            );
        }
        return Ok(());
    }
    println!(
        "kubelet-path: CPU s per GiB of kubectl 1.35 exec stdout (medians of {rounds}; 1.37 root and leaves)\n"
    );
    println!(
        "| relaylet | leaf kubelet | {} | MiB/s |\n|---|---|{}---:|",
        kubelet_path::PROCESSES.join(" | "),
        "---:|".repeat(kubelet_path::PROCESSES.len())
    );
    for r in &rows {
        let cells: Vec<String> = (0..kubelet_path::PROCESSES.len())
            .map(|i| {
                let samples: Vec<f64> = r.cpu_per_gib.iter().map(|s| s[i]).collect();
                report::median(&samples).map_or("-".to_string(), |m| format!("{m:.2}"))
            })
            .collect();
        println!(
            "| {} | {} | {} | {} |",
            yes_no(r.relaylet_declares),
            yes_no(r.kubelet_declares),
            cells.join(" | "),
            report::median(&r.throughput).map_or("-".to_string(), |m| format!("{m:.0}"))
        );
    }
    Ok(())
}

/// The fleet figures (`--only fleet`), printed as they come and as a table.
async fn run_fleet(options: Options) -> anyhow::Result<()> {
    let size = fleet::Size::for_mode(
        options.smoke,
        options.quick,
        options.leaves,
        options.idle_minutes,
    );
    eprintln!(
        "fleet: {} leaves, {} leaf pods with {} B annotations",
        size.leaves, size.pods, 4096
    );
    let figures = fleet::run(size).await.context("the fleet figures")?;
    if options.json {
        for f in &figures {
            let mut row = serde_json::json!({"name": f.name, "value": f.value, "unit": f.unit});
            if let Some(replica) = &f.replica {
                row["replica"] = serde_json::json!(replica);
            }
            println!("{row}");
        }
    } else {
        println!(
            "fleet: {} leaves, {} leaf pods (4 KiB annotation each)\n",
            size.leaves, size.pods
        );
        println!("| figure | replica | value | unit |\n|---|---|---:|---|");
        for f in &figures {
            println!(
                "| {} | {} | {:.3} | {} |",
                f.name,
                f.replica.as_deref().unwrap_or("all"),
                f.value,
                f.unit
            );
        }
        println!("\nFleet targets:");
    }
    for target in fleet::targets(&figures) {
        println!("- {target}");
    }
    Ok(())
}

/// The pod-sync figures (`--only podsync`): start and delete latencies of pods run through
/// relaylet against pods run in the leaf directly, relaylet's writes and requests per pod, its
/// memory per synced pod; as a table (or JSON lines), then the target lines.
async fn run_pod_sync(options: Options) -> anyhow::Result<()> {
    let size = pod_sync::Size::for_mode(options.smoke, options.quick);
    eprintln!(
        "podsync: {} pods per route (direct, relayed), {} at once",
        size.pods, size.batch
    );
    let figures = pod_sync::run(size).await.context("the podsync figures")?;
    if options.json {
        for f in &figures {
            println!("{}", f.json());
        }
    } else {
        println!(
            "podsync: {} pods per route, created and deleted {} at once; ratio = relayed / direct\n",
            size.pods, size.batch
        );
        println!("{}", pod_sync::table(&figures));
        println!("Pod sync targets:");
    }
    for target in pod_sync::targets(&figures) {
        println!("- {target}");
    }
    Ok(())
}

/// Emits a figure as soon as it is known (JSON mode) and keeps it for the table.
fn emit(figures: &mut Vec<Figure>, figure: Figure, options: Options) {
    if options.json {
        println!("{}", figure.json());
    } else {
        eprintln!(
            "  {}: direct {:?} limit {:?} relayed {:?} ratio {:?}",
            figure.name, figure.direct, figure.limit, figure.relayed, figure.ratio
        );
    }
    figures.push(figure);
}

/// The route order of repetition `rep`: rotated so no route always goes first.
fn order(rep: usize) -> [Route; 3] {
    let mut routes = Route::ALL;
    routes.rotate_left(rep % 3);
    routes
}

/// Per-route samples.
#[derive(Default)]
struct Samples {
    direct: Vec<f64>,
    limit: Vec<f64>,
    relayed: Vec<f64>,
}

impl Samples {
    fn push(&mut self, route: Route, value: f64) {
        match route {
            Route::Direct => self.direct.push(value),
            Route::Limit => self.limit.push(value),
            Route::Relayed => self.relayed.push(value),
        }
    }

    fn figure(&self, name: &str, unit: &'static str, better: Better) -> Figure {
        Figure::from_samples(name, unit, better, &self.direct, &self.limit, &self.relayed)
    }
}

/// Which bulk transfer a throughput figure times.
#[derive(Debug, Clone, Copy)]
enum Bulk {
    ExecStdout,
    PortForward,
    LogsFollow,
}

async fn bulk(stack: &Stack, route: Route, kind: Bulk, sizes: &Sizes) -> anyhow::Result<Transfer> {
    let target = stack.target(route);
    match kind {
        Bulk::ExecStdout => client::exec_stdout(target, &stack.pod, sizes.stream_bytes).await,
        Bulk::PortForward => {
            client::portforward(target, &stack.pod, stack::SENDER_PORT, sizes.stream_bytes).await
        }
        Bulk::LogsFollow => client::logs_follow(target, &stack.pod, "logs", sizes.log_bytes).await,
    }
}

async fn measure(stack: &Stack, sizes: &Sizes, options: Options) -> anyhow::Result<Vec<Figure>> {
    let mut figures = Vec::new();
    if options.only.bulk {
        measure_bulk(stack, sizes, options, &mut figures).await?;
    }
    if options.only.rtt {
        measure_rtt(stack, sizes, options, &mut figures).await?;
    }
    if options.only.setup {
        measure_setup(stack, sizes, options, &mut figures).await?;
    }
    if options.only.memory {
        measure_memory(stack, sizes, options, &mut figures).await?;
    }
    if options.only.proxy {
        measure_proxy(stack, sizes, options, &mut figures).await?;
    }
    Ok(figures)
}

/// Figures 1, 3, 4 and 7: bulk throughput, with the relays' CPU time per sample.
async fn measure_bulk(
    stack: &Stack,
    sizes: &Sizes,
    options: Options,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    // cpu[rep] per route: (cpu seconds, bytes) summed over the three bulk figures; system[rep]
    // the same for the whole process tree (client, leaf and its pods, and the relay).
    let mut cpu: Vec<[(f64, u64); 3]> = vec![[(0.0, 0); 3]; sizes.reps];
    let mut system: Vec<[(f64, u64); 3]> = vec![[(0.0, 0); 3]; sizes.reps];
    let me = std::process::id();
    for (kind, name) in [
        (Bulk::ExecStdout, "exec_stdout_throughput"),
        (Bulk::PortForward, "portforward_throughput"),
        (Bulk::LogsFollow, "logs_follow_throughput"),
    ] {
        eprintln!("measuring {name}");
        // One unmeasured run per route: caches, connection pools, the log file.
        for route in Route::ALL {
            bulk(stack, route, kind, sizes)
                .await
                .with_context(|| format!("{name} warm-up"))?;
        }
        let mut samples = Samples::default();
        for (rep, (per_route, whole)) in cpu.iter_mut().zip(system.iter_mut()).enumerate() {
            for route in order(rep) {
                let pid = stack.relay_pid(route);
                let before = pid.map(procfs::cpu_time).transpose()?;
                let tree_before = procfs::tree_cpu_time(me)?;
                let transfer = bulk(stack, route, kind, sizes)
                    .await
                    .with_context(|| format!("{name} {route:?}"))?;
                let tree_used = procfs::tree_cpu_time(me)?.saturating_sub(tree_before);
                let slot = &mut whole[route as usize];
                slot.0 += tree_used.as_secs_f64();
                slot.1 += transfer.bytes;
                if let (Some(pid), Some(before)) = (pid, before) {
                    let used = procfs::cpu_time(pid)?.saturating_sub(before);
                    let slot = &mut per_route[route as usize];
                    slot.0 += used.as_secs_f64();
                    slot.1 += transfer.bytes;
                }
                samples.push(route, transfer.mib_per_s());
            }
        }
        emit(
            figures,
            samples.figure(name, "MiB/s", Better::Higher),
            options,
        );
    }

    // Figure 7 from the bulk samples.
    let mut cpu_per_gib = Samples::default();
    for per_route in &cpu {
        for route in [Route::Limit, Route::Relayed] {
            let (seconds, bytes) = per_route[route as usize];
            if bytes > 0 {
                cpu_per_gib.push(route, seconds / (bytes as f64 / (1u64 << 30) as f64));
            }
        }
    }
    let relay_cost = cpu_per_gib.figure("cpu_per_gib", "CPU s/GiB", Better::Lower);
    let relaylet_cost = relay_cost.relayed;
    emit(figures, relay_cost, options);

    // The floor, measured once per repetition on as many bytes as relaylet moved in it, and
    // reported as the median: a single measurement moved by up to 1.4x between runs on this
    // shared machine (0.95 and 1.32 CPU s/GiB in two back-to-back quick runs).
    let mut floors = Vec::new();
    eprintln!("measuring floor_cpu_per_gib");
    for per_route in &system {
        let bytes = per_route[Route::Relayed as usize].1.max(16 << 20);
        let floor = tokio::task::spawn_blocking(move || floor::measure(bytes))
            .await
            .context("floor task")??;
        eprintln!(
            "  floor ({}, {} MiB): record cipher {:.2} + TCP splice {:.2} = {:.2} CPU s/GiB; through rustls connections {:.2}",
            floor.suite,
            bytes >> 20,
            floor.crypto,
            floor.tcp,
            floor.total(),
            floor.rustls
        );
        floors.push(floor);
    }
    let floor_tcp = report::median(&floors.iter().map(|f| f.tcp).collect::<Vec<_>>());
    let floor_total = report::median(&floors.iter().map(floor::Floor::total).collect::<Vec<_>>());
    emit(
        figures,
        Figure {
            name: "floor_cpu_per_gib".into(),
            unit: "CPU s/GiB",
            direct: floor_tcp,
            limit: floor_total,
            relayed: relaylet_cost,
            ratio: match (floor_total, relaylet_cost) {
                (Some(f), Some(r)) if r > 0.0 => Some(f / r),
                _ => None,
            },
            n: floors.len(),
        },
        options,
    );

    // Whole-system CPU per GiB: client, leaf, pods and relay together.
    let mut whole = Samples::default();
    for per_route in &system {
        for route in Route::ALL {
            let (seconds, bytes) = per_route[route as usize];
            if bytes > 0 {
                whole.push(route, seconds / (bytes as f64 / (1u64 << 30) as f64));
            }
        }
    }
    let mut system_cost = whole.figure("system_cpu_per_gib", "CPU s/GiB", Better::Lower);
    // Against direct plus the floor: what a relay must add at least.
    system_cost.ratio = match (system_cost.direct, system_cost.relayed) {
        (Some(d), Some(r)) if r > 0.0 => floor_total.map(|f| (d + f) / r),
        _ => None,
    };
    emit(figures, system_cost, options);
    Ok(())
}

/// The proxy figures: `direct` is the client straight to the leaf, `limit` relaylet dialling
/// the leaf, `relayed` relaylet reaching the same leaf through the test kit's HTTP CONNECT
/// proxy (its own virtual node and pod copy); `ratio` is through the proxy against dialled.
async fn measure_proxy(
    stack: &Stack,
    sizes: &Sizes,
    options: Options,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    // The three ways in, in the columns of a figure.
    let ways = [
        (Route::Direct, &stack.pod),
        (Route::Limit, &stack.pod),
        (Route::Relayed, &stack.proxied_pod),
    ];
    let target = |column: Route| match column {
        Route::Direct => stack.target(Route::Direct),
        _ => stack.target(Route::Relayed),
    };
    eprintln!("measuring proxy_exec_stdout_throughput, proxy_exec_rtt, proxy_exec_setup_rate");
    let mut throughput = Samples::default();
    let mut p99 = Samples::default();
    let mut rate = Samples::default();
    for rep in 0..sizes.reps {
        let mut rotated = ways;
        rotated.rotate_left(rep % 3);
        for (column, pod) in rotated {
            let transfer = client::exec_stdout(target(column), pod, sizes.stream_bytes)
                .await
                .with_context(|| format!("proxy figures: exec stdout {column:?}"))?;
            throughput.push(column, transfer.mib_per_s());
            let trips = client::exec_round_trips(target(column), pod, sizes.round_trips)
                .await
                .with_context(|| format!("proxy figures: round trips {column:?}"))?;
            p99.push(column, percentile(&trips, 99.0).unwrap_or(f64::NAN));
            let start = Instant::now();
            for _ in 0..sizes.setups {
                client::exec_true(target(column), pod)
                    .await
                    .with_context(|| format!("proxy figures: setup {column:?}"))?;
            }
            rate.push(column, sizes.setups as f64 / start.elapsed().as_secs_f64());
        }
    }
    for figure in [
        throughput.figure("proxy_exec_stdout_throughput", "MiB/s", Better::Higher),
        p99.figure("proxy_exec_rtt_p99", "us", Better::Lower),
        rate.figure("proxy_exec_setup_rate", "sessions/s", Better::Higher),
    ] {
        emit(figures, figure, options);
    }
    Ok(())
}

/// Figure 2: interactive round trips.
async fn measure_rtt(
    stack: &Stack,
    sizes: &Sizes,
    options: Options,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    eprintln!("measuring exec_rtt");
    let mut p50 = Samples::default();
    let mut p99 = Samples::default();
    for rep in 0..sizes.reps {
        for route in order(rep) {
            let trips =
                client::exec_round_trips(stack.target(route), &stack.pod, sizes.round_trips)
                    .await
                    .with_context(|| format!("round trips {route:?}"))?;
            p50.push(route, percentile(&trips, 50.0).unwrap_or(f64::NAN));
            p99.push(route, percentile(&trips, 99.0).unwrap_or(f64::NAN));
        }
    }
    emit(
        figures,
        p50.figure("exec_rtt_p50", "us", Better::Lower),
        options,
    );
    emit(
        figures,
        p99.figure("exec_rtt_p99", "us", Better::Lower),
        options,
    );
    Ok(())
}

/// Figure 5: session setup rate, one session at a time.
async fn measure_setup(
    stack: &Stack,
    sizes: &Sizes,
    options: Options,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    eprintln!("measuring exec_setup_rate");
    let mut rate = Samples::default();
    for rep in 0..sizes.reps {
        for route in order(rep) {
            let start = Instant::now();
            for _ in 0..sizes.setups {
                client::exec_true(stack.target(route), &stack.pod)
                    .await
                    .with_context(|| format!("exec true {route:?}"))?;
            }
            rate.push(route, sizes.setups as f64 / start.elapsed().as_secs_f64());
        }
    }
    emit(
        figures,
        rate.figure("exec_setup_rate", "sessions/s", Better::Higher),
        options,
    );
    Ok(())
}

/// Figure 6: relaylet's memory per idle session, then what is left after they close.
async fn measure_memory(
    stack: &Stack,
    sizes: &Sizes,
    options: Options,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    for &count in &sizes.idle_sessions {
        eprintln!(
            "measuring idle_session_memory with {count} sessions (hold endpoint behind the leaf)"
        );
        let idle = idle_sessions(stack, count).await?;
        emit(
            figures,
            Figure {
                name: format!("idle_session_memory_{count}"),
                unit: "KiB/session",
                direct: None,
                limit: None,
                relayed: Some(idle.per_session_kib),
                ratio: None,
                n: 1,
            },
            options,
        );
        if Some(&count) == sizes.idle_sessions.last() {
            for (name, unit, value) in [
                (
                    "after_close_rss_growth",
                    "KiB",
                    idle.rss_growth_after_close_kib,
                ),
                ("after_close_fd_growth", "fds", idle.fd_growth_after_close),
                (
                    "second_cycle_rss_growth",
                    "KiB",
                    idle.rss_growth_second_cycle_kib,
                ),
            ] {
                emit(
                    figures,
                    Figure {
                        name: name.into(),
                        unit,
                        direct: None,
                        limit: None,
                        relayed: Some(value),
                        ratio: None,
                        n: 1,
                    },
                    options,
                );
            }
        }
    }
    Ok(())
}

/// What the idle-session measurement found.
struct IdleResult {
    per_session_kib: f64,
    rss_growth_after_close_kib: f64,
    fd_growth_after_close: f64,
    /// RSS after a second open-and-close cycle minus RSS after the first: near zero when the
    /// memory kept after the first close is reused (allocator retention), positive if it leaks.
    rss_growth_second_cycle_kib: f64,
}

/// How many sessions are opened at once while building up the idle set.
const OPEN_CONCURRENCY: usize = 32;
/// Time given to relaylet to settle after the sessions open.
const SETTLE: Duration = Duration::from_secs(2);
/// Time given to relaylet after the sessions close: closing thousands takes a second or two,
/// and relaylet returns freed memory a second after the last one ends (`src/ops/memory.rs`).
const SETTLE_AFTER_CLOSE: Duration = Duration::from_secs(5);

/// Opens `count` idle sessions through relaylet to the hold leaf, all at once held open.
async fn open_sessions(
    stack: &Stack,
    count: usize,
) -> anyhow::Result<Vec<hyper::upgrade::Upgraded>> {
    let target = stack.target(Route::Relayed);
    futures::stream::iter(0..count)
        .map(|_| client::open_idle(target, &stack.hold_pod))
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()
        .context("opening idle sessions")
}

async fn idle_sessions(stack: &Stack, count: usize) -> anyhow::Result<IdleResult> {
    let pid = stack.relaylet.pid;
    tokio::time::sleep(SETTLE).await;
    let rss_before = procfs::rss_kib(pid)?;
    let fds_before = procfs::fd_count(pid)?;
    let sessions = open_sessions(stack, count).await?;
    tokio::time::sleep(SETTLE).await;
    let rss_open = procfs::rss_kib(pid)?;
    let fds_open = procfs::fd_count(pid)?;
    anyhow::ensure!(
        fds_open >= fds_before + 2 * count as u64,
        "relaylet holds {fds_open} fds with {count} sessions open (from {fds_before}): sessions are not all open"
    );
    drop(sessions);
    tokio::time::sleep(SETTLE_AFTER_CLOSE).await;
    let rss_after = procfs::rss_kib(pid)?;
    let fds_after = procfs::fd_count(pid)?;
    drop(open_sessions(stack, count).await?);
    tokio::time::sleep(SETTLE_AFTER_CLOSE).await;
    let rss_after_second = procfs::rss_kib(pid)?;
    Ok(IdleResult {
        per_session_kib: (rss_open as f64 - rss_before as f64) / count as f64,
        rss_growth_after_close_kib: rss_after as f64 - rss_before as f64,
        fd_growth_after_close: fds_after as f64 - fds_before as f64,
        rss_growth_second_cycle_kib: rss_after_second as f64 - rss_after as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Options> {
        Options::parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn every_group_runs_unless_some_are_named() {
        let all = parse(&["--quick"]).unwrap();
        assert!(all.quick && all.only.bulk && all.only.rtt && all.only.setup && all.only.memory);

        let some = parse(&["--only", "setup,memory", "--json"]).unwrap();
        assert!(some.json && some.only.setup && some.only.memory);
        assert!(!some.only.bulk && !some.only.rtt);
    }

    #[test]
    fn bad_options_are_named() {
        let proxy = parse(&["--only", "proxy"]).unwrap();
        assert!(proxy.only.proxy && !proxy.only.bulk && !proxy.only.memory);
        let err = parse(&["--only", "setup,cpu"]).unwrap_err().to_string();
        assert!(err.contains("\"cpu\""), "{err}");
        let err = parse(&["--only"]).unwrap_err().to_string();
        assert!(err.contains("--only needs a list"), "{err}");
        let err = parse(&["--fast"]).unwrap_err().to_string();
        assert!(err.contains("\"--fast\""), "{err}");
    }

    #[test]
    fn fleet_sizes_are_whole_numbers_above_zero() {
        let fleet = parse(&[
            "--only",
            "fleet",
            "--leaves",
            "1000",
            "--idle-minutes",
            "60",
        ])
        .unwrap();
        assert!(fleet.only.fleet);
        assert_eq!((fleet.leaves, fleet.idle_minutes), (Some(1000), Some(60)));
        let size = fleet::Size::for_mode(false, false, fleet.leaves, fleet.idle_minutes);
        assert_eq!((size.leaves, size.pods, size.kubelets), (1000, 10_000, 100));
        assert_eq!(size.long_idle, Duration::from_secs(3600));
        for bad in [
            &["--leaves"][..],
            &["--leaves", "0"],
            &["--leaves", "-3"],
            &["--idle-minutes", "x"],
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad[0]), "{err}");
        }
    }

    #[test]
    fn podsync_runs_only_when_named() {
        let podsync = parse(&["--only", "podsync", "--quick"]).unwrap();
        assert!(podsync.only.pod_sync && !podsync.only.fleet && !podsync.only.bulk);
        assert!(!parse(&[]).unwrap().only.pod_sync);
        assert!(!parse(&["--quick"]).unwrap().only.pod_sync);
        let both = parse(&["--only", "fleet,podsync"]).unwrap();
        assert!(both.only.fleet && both.only.pod_sync && !both.only.data_path());
        let size = pod_sync::Size::for_mode(podsync.smoke, podsync.quick);
        assert_eq!((size.pods, size.batch), (200, 20));
        let err = parse(&["--only", "pod-sync"]).unwrap_err().to_string();
        assert!(err.contains("podsync"), "{err}");
    }
}
