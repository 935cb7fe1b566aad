//! End to end with real `kubectl` binaries: kubectl -> root apiserver stand-in -> relaylet (as
//! the virtual node's kubelet) -> leaf apiserver stand-in -> leaf kubelet stand-in -> a real
//! local process. kubectl 1.27 speaks SPDY only; 1.33 and 1.35 try WebSocket v5 first (the root
//! stand-in translates it to SPDY towards relaylet, as kube-apiserver does), and are also run with
//! WebSockets turned off.

use relaylet_dev::testkit as support;
use support::port_forward::PortForward;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::cluster::{SimContainer, SimPod};
use support::{Run, describe, env, kubectl_variants, kubectls, text, wait_exit, wait_until};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// A gauge of relaylet's open sessions, e.g. `relaylet_sessions_active{kind="attach",leaf="leaf-2"}`.
fn sessions_active(e: &support::Env, kind: &str, leaf: &str) -> u64 {
    let text = e.sandbox.relaylet.metrics.encode().unwrap_or_default();
    let series = format!("relaylet_sessions_active{{kind=\"{kind}\",leaf=\"{leaf}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A pod whose main process answers each stdin line, for attach.
fn echo_pod() -> SimPod {
    SimPod {
        namespace: "default".into(),
        name: "echo".into(),
        containers: vec![SimContainer {
            name: "main".into(),
            command: vec![
                "sh".into(),
                "-c".into(),
                "while read line; do echo \"got $line\"; done".into(),
            ],
            stdin: true,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn settings() -> Settings {
    Settings {
        pods: vec![
            ("leaf-2".into(), echo_pod()),
            // Restarted by the `--previous` test; nothing else uses it.
            ("leaf-1".into(), relaylet_dev::sandbox::demo_pod("restarts")),
        ],
        ..Settings::default()
    }
}

fn run<'a>(
    k: &'a relaylet_sim::tools::Kubectl,
    spdy: bool,
    kubeconfig: &'a std::path::Path,
    args: &[&str],
) -> Run<'a> {
    let r = Run::new(k, kubeconfig, args);
    if spdy { r.spdy_only() } else { r }
}

#[test]
fn exec_output_stderr_split_and_exit_codes() {
    let e = env(settings);
    for (k, spdy) in kubectl_variants() {
        let out = run(
            &k,
            spdy,
            &e.kubeconfig,
            &[
                "exec",
                "demo-1",
                "-c",
                "main",
                "--",
                "sh",
                "-c",
                "echo out; echo err >&2; exit 3",
            ],
        )
        .output();
        let what = format!("{} spdy={spdy}", describe(&k, &out));
        assert_eq!(text(&out.stdout), "out\n", "{what}");
        assert!(text(&out.stderr).contains("err\n"), "{what}");
        assert!(!text(&out.stdout).contains("err"), "{what}");
        assert_eq!(out.status.code(), Some(3), "{what}");

        let out = run(
            &k,
            spdy,
            &e.kubeconfig,
            &["exec", "demo-2", "--", "sh", "-c", "echo fine"],
        )
        .output();
        assert_eq!(
            (out.status.code(), text(&out.stdout).as_str()),
            (Some(0), "fine\n"),
            "{}",
            describe(&k, &out)
        );

        let out = run(
            &k,
            spdy,
            &e.kubeconfig,
            &["exec", "demo-1", "--", "sh", "-c", "exit 127"],
        )
        .output();
        assert_eq!(out.status.code(), Some(127), "{}", describe(&k, &out));
    }
}

/// A binary that does not exist: the same words as the real apiserver and kubelet say them
/// (tests/real/k8s.rs holds the same assertion).
#[test]
fn exec_of_a_missing_binary_fails_with_the_kubelets_error() {
    let e = env(settings);
    for (k, spdy) in kubectl_variants() {
        let out = run(
            &k,
            spdy,
            &e.kubeconfig,
            &["exec", "demo-1", "--", "no-such-binary"],
        )
        .output();
        assert!(!out.status.success(), "{}", describe(&k, &out));
        support::assert_missing_binary_error(&k, spdy, &out, "no-such-binary");
    }
}

#[test]
fn exec_stdin_reaches_the_process_and_eof_ends_it() {
    let e = env(settings);
    for (k, spdy) in kubectl_variants() {
        let out = run(
            &k,
            spdy,
            &e.kubeconfig,
            &["exec", "-i", "demo-2", "--", "sh", "-c", "cat; echo done"],
        )
        .stdin(b"hello from stdin\nsecond line\n")
        .output();
        assert_eq!(
            text(&out.stdout),
            "hello from stdin\nsecond line\ndone\n",
            "{} spdy={spdy}",
            describe(&k, &out)
        );
        assert_eq!(out.status.code(), Some(0));
    }
}

/// Drives kubectl under a real PTY (python's pty module), resizes it mid-session, and checks the
/// remote `stty size` sees both sizes.
#[test]
fn exec_tty_gets_initial_size_and_resize() {
    let e = env(settings);
    for (k, spdy) in kubectl_variants() {
        support::assert_tty_size_and_resize(&k, &e.kubeconfig, "demo-1", spdy);
    }
}

#[test]
fn attach_sends_stdin_to_the_main_process_and_streams_its_output() {
    let e = env(settings);
    for (k, spdy) in kubectl_variants() {
        let marker = format!("attach-{}-{spdy}", k.version);
        let mut cmd = run(
            &k,
            spdy,
            &e.kubeconfig,
            &["attach", "-i", "echo", "-c", "main"],
        )
        .command();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl attach runs");
        let mut stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, read) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let done = line.contains("stop");
                lines.push(line);
                if done {
                    break;
                }
            }
            let _ = tx.send(lines);
        });
        // Attach is live (what the process prints before the session is attached is not
        // replayed): write once relaylet has the session open towards the leaf.
        wait_until("the attach session is open", HANG, || {
            sessions_active(e, "attach", "leaf-2") == 1
        });
        use std::io::Write;
        writeln!(stdin, "{marker}").expect("write stdin");
        writeln!(stdin, "stop").expect("write stdin");
        stdin.flush().expect("flush stdin");
        let lines = read.recv_timeout(HANG);
        let _ = child.kill();
        let _ = wait_exit(child, HANG);
        wait_until("the attach session ends", HANG, || {
            sessions_active(e, "attach", "leaf-2") == 0
        });
        let lines = lines.expect("kubectl printed the answer to stop");
        assert!(
            lines.iter().any(|l| l == &format!("got {marker}")),
            "kubectl {} spdy={spdy}: {lines:?}",
            k.version
        );
    }
}

#[test]
fn port_forward_carries_http_to_the_pod() {
    let e = env(settings);
    for k in kubectls() {
        for ws_off in [false, true] {
            let mut r = Run::new(&k, &e.kubeconfig, &["port-forward", "pod/demo-2", ":8080"]);
            if ws_off {
                r.env
                    .push(("KUBECTL_PORT_FORWARD_WEBSOCKETS".into(), "false".into()));
            }
            let forward = PortForward::start(r);
            // kubectl prints "Forwarding from" as soon as it listens; the first exchange waits
            // until relaylet has the session open.
            wait_until("the port-forward session is open", HANG, || {
                sessions_active(e, "portForward", "leaf-2") >= 1
            });
            for attempt in 0..3 {
                let body = forward.body();
                assert_eq!(
                    body.as_deref(),
                    Some("hello from demo-2\n"),
                    "kubectl {} ws_off={ws_off} attempt {attempt}",
                    k.version
                );
            }
        }
    }
}

#[test]
fn logs_with_every_option() {
    let e = env(settings);
    // The demo pod prints a line a second; wait for its log to span more than the 2 s of
    // `--since=2s` below.
    let stamped = |k: &relaylet_sim::tools::Kubectl| {
        let out = Run::new(k, &e.kubeconfig, &["logs", "demo-2", "--timestamps"]).output();
        text(&out.stdout)
            .lines()
            .map(|l| {
                let (stamp, line) = l.split_once(' ').expect("timestamped line");
                let stamp: k8s_openapi::jiff::Timestamp = stamp.parse().expect("timestamp");
                (stamp, line.to_string())
            })
            .collect::<Vec<_>>()
    };
    let two_s = k8s_openapi::jiff::SignedDuration::from_secs(2);
    wait_until("demo-2 logs more than 2 s of lines", HANG, || {
        let lines = stamped(&kubectls()[2]);
        lines.len() >= 3 && lines[0].0 < lines[lines.len() - 1].0 - two_s
    });
    for k in kubectls() {
        let logs = |args: &[&str]| {
            let mut all = vec!["logs", "demo-2", "-c", "main"];
            all.extend_from_slice(args);
            Run::new(&k, &e.kubeconfig, &all).output()
        };
        let out = logs(&[]);
        let full = text(&out.stdout);
        assert!(
            full.lines().count() >= 3 && full.lines().all(|l| l.starts_with("demo-2 tick ")),
            "{}",
            describe(&k, &out)
        );

        let out = logs(&["--tail=2"]);
        assert_eq!(
            text(&out.stdout).lines().count(),
            2,
            "{}",
            describe(&k, &out)
        );

        let out = logs(&["--timestamps", "--tail=1"]);
        let line = text(&out.stdout);
        let (stamp, rest) = line.split_once(' ').expect("timestamped line");
        assert!(
            stamp.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
            "{line:?}"
        );
        assert!(rest.starts_with("demo-2 tick "), "{line:?}");

        let out = logs(&["--limit-bytes=7"]);
        assert_eq!(text(&out.stdout), "demo-2 ", "{}", describe(&k, &out));

        // The log's own timestamps, not the test's clock: `--since=2s` is counted back from
        // the leaf's now, which is after the last line already written, so a line written
        // more than 2 s before that one is left out; the newest line is kept.
        let before = stamped(&k);
        let (last_stamp, _) = before.last().cloned().expect("lines");
        let (first_stamp, first_line) = before.first().cloned().expect("lines");
        assert!(first_stamp < last_stamp - two_s, "{before:?}");
        let out = logs(&["--since=2s", "--timestamps"]);
        let got = text(&out.stdout);
        assert!(!got.is_empty(), "since=2s: {}", describe(&k, &out));
        for l in got.lines() {
            let (stamp, _) = l.split_once(' ').expect("timestamped line");
            let stamp: k8s_openapi::jiff::Timestamp = stamp.parse().expect("timestamp");
            assert!(
                stamp >= last_stamp - two_s,
                "since=2s kept a line written more than 2 s before {last_stamp}: {}",
                describe(&k, &out)
            );
        }
        assert!(
            !got.contains(&format!(" {first_line}\n")),
            "since=2s left out the oldest line: {}",
            describe(&k, &out)
        );

        // `--since-time` at a line's own timestamp (kubectl sends whole seconds): exactly the
        // lines from that second on, as far as they were written when `before` was read.
        let from =
            k8s_openapi::jiff::Timestamp::from_second(before[before.len() - 2].0.as_second())
                .expect("timestamp");
        let out = logs(&[&format!("--since-time={from}")]);
        let expected: Vec<&str> = before
            .iter()
            .filter(|(stamp, _)| *stamp >= from)
            .map(|(_, l)| l.as_str())
            .collect();
        let got = text(&out.stdout);
        let got: Vec<&str> = got.lines().collect();
        assert!(
            got.len() >= expected.len() && got[..expected.len()] == expected[..],
            "since-time={from}: {expected:?}: {}",
            describe(&k, &out)
        );
    }
}

/// Restarts the container of its own pod, `restarts`, so no other test sees the restart.
#[test]
fn logs_previous_shows_the_last_instance() {
    let e = env(settings);
    // The leaf's refusal reads as a kubelet's: its message, not a JSON Status.
    for k in [&kubectls()[0], &kubectls()[2]] {
        let out = Run::new(k, &e.kubeconfig, &["logs", "--previous", "restarts"]).output();
        assert!(
            !out.status.success(),
            "no previous instance yet: {}",
            describe(k, &out)
        );
        assert_eq!(
            text(&out.stderr).trim_end(),
            "Error from server (BadRequest): previous terminated container \"main\" in pod \"restarts\" not found",
            "{}",
            describe(k, &out)
        );
    }
    let k = &kubectls()[2];
    // The first instance has written its first line before it is restarted.
    wait_until("restarts logs its first line", HANG, || {
        let out = Run::new(k, &e.kubeconfig, &["logs", "restarts"]).output();
        text(&out.stdout).contains("restarts tick 0\n")
    });
    let leaf = &e.sandbox.leaves["leaf-1"];
    support::RT
        .block_on(
            leaf.kubelet("leaf-1-node")
                .unwrap()
                .restart_container("default", "restarts", "main"),
        )
        .expect("restart");
    let out = Run::new(k, &e.kubeconfig, &["logs", "--previous", "restarts"]).output();
    assert!(out.status.success(), "{}", describe(k, &out));
    assert!(
        text(&out.stdout).contains("restarts tick 0\n"),
        "{}",
        describe(k, &out)
    );
}

/// `logs -f` streams until kubectl is killed; the leaf's log request closes with it.
#[test]
fn logs_follow_streams_and_stops_with_the_client() {
    let e = env(settings);
    let k = &kubectls()[1];
    let mut cmd = Run::new(k, &e.kubeconfig, &["logs", "-f", "--tail=1", "demo-2"]).command();
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        seen.push(line);
    }
    assert!(
        seen.iter().all(|l| l.starts_with("demo-2 tick ")),
        "{seen:?}"
    );
    let numbers: Vec<u64> = seen
        .iter()
        .filter_map(|l| l.trim().rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "consecutive lines as they are written: {numbers:?}"
    );
    let kubelet = e.sandbox.leaves["leaf-2"].kubelet("leaf-2-node").unwrap();
    assert!(kubelet.open_log_streams() >= 1);
    child.kill().unwrap();
    let _ = child.wait();
    // The pod logs forever: only kubectl's death can end the leaf's follow request.
    wait_until(
        "the leaf's follow request closed after kubectl died",
        HANG,
        || kubelet.open_log_streams() == 0,
    );
}

/// Killing kubectl mid-session ends the session in the leaf. The remote shell waits for its
/// stdin to end and only then runs `sleep <marker>`; kubectl's stdin stays open and relaylet's
/// idle timeout is 4 h, so only relaylet ending the leaf session after the client died can
/// close that stdin. (The process itself then runs on, as with a real container runtime,
/// which does not kill an exec whose client left.)
#[test]
fn killed_client_ends_the_leaf_session() {
    let e = env(settings);
    for (k, spdy) in kubectl_variants() {
        let marker = format!("{}", 7000 + k.minor() * 2 + u32::from(spdy));
        let script = format!("echo started; cat >/dev/null; exec sleep {marker}");
        let mut cmd = run(
            &k,
            spdy,
            &e.kubeconfig,
            &["exec", "-i", "demo-1", "--", "sh", "-c", &script],
        )
        .command();
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl exec runs");
        let mut first = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut first,
        )
        .expect("the remote shell starts");
        assert_eq!(first, "started\n");
        assert!(!sleep_running(&marker), "stdin is still open");
        child.kill().expect("kill kubectl");
        let _ = child.wait();
        wait_until(
            &format!(
                "kubectl {} spdy={spdy}: the leaf session ends after the client died (stdin closed)",
                k.version
            ),
            HANG,
            || sleep_running(&marker),
        );
    }
}

/// Whether a `sleep <marker>` process is alive on this machine.
fn sleep_running(marker: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .map(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.first().is_some_and(|a| a.ends_with(b"sleep"))
                    && args.get(1) == Some(&marker.as_bytes())
            })
            .unwrap_or(false)
            && !std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|s| s.contains(") Z "))
    })
}

#[test]
fn get_and_describe_show_virtual_nodes_and_pods() {
    let e = env(settings);
    let k = &kubectls()[2];
    let out = Run::new(k, &e.kubeconfig, &["get", "nodes", "-o", "wide"]).output();
    let table = text(&out.stdout);
    assert!(
        table.contains("relaylet-leaf-1") && table.contains("relaylet-leaf-2"),
        "{}",
        describe(k, &out)
    );
    assert!(table.contains("Ready"), "{table}");
    let out = Run::new(k, &e.kubeconfig, &["describe", "node", "relaylet-leaf-1"]).output();
    let d = text(&out.stdout);
    assert!(
        d.contains("LeafReady") && d.contains("virtual-kubelet.io/provider=relaylet:NoSchedule"),
        "{d}"
    );
    let out = Run::new(k, &e.kubeconfig, &["get", "pods", "-o", "wide"]).output();
    assert!(
        text(&out.stdout).contains("relaylet-leaf-2"),
        "{}",
        describe(k, &out)
    );
}

/// `kubectl debug -i` on a root pod: the ephemeral container goes through the root apiserver's
/// `pods/ephemeralcontainers`, the syncer stand-in carries it to the leaf copy where the leaf
/// kubelet runs it, its status comes back up, and kubectl attaches to it through relaylet.
/// Every kubectl variant, each with its own container; the container answers a line of stdin
/// (it waits for it, so no output comes before kubectl has attached).
#[test]
fn kubectl_debug_attaches_to_an_ephemeral_container_in_the_leaf() {
    use std::io::Write;
    let e = env(settings);
    for (k, spdy) in kubectl_variants() {
        let container = format!("dbg-1{}-{}", k.minor(), u8::from(spdy));
        let mut cmd = run(
            &k,
            spdy,
            &e.kubeconfig,
            &[
                "debug",
                "demo-2",
                "-i",
                "--image=busybox",
                "-c",
                &container,
                "--",
                "sh",
                "-c",
                "read line; echo got $line in $HOSTNAME",
            ],
        )
        .command();
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl debug runs");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"ping\n").expect("stdin");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("kubectl's output");
        assert_eq!(
            line, "got ping in demo-2\n",
            "kubectl {} spdy={spdy}",
            k.version
        );
        drop(stdin);
        let status = wait_exit(child, HANG);
        assert!(
            status.is_some_and(|s| s.success()),
            "kubectl {} spdy={spdy}",
            k.version
        );
        // The leaf ran it; the root pod reports it ended as the leaf kubelet saw it.
        let store = e.sandbox.root.api.store();
        wait_until(
            &format!("{container} reported terminated with exit code 0 in the root pod"),
            HANG,
            || {
                let pod: k8s_openapi::api::core::v1::Pod =
                    store.get_typed("default", "demo-2").expect("root pod");
                pod.status
                    .and_then(|s| s.ephemeral_container_statuses)
                    .into_iter()
                    .flatten()
                    .any(|s| {
                        s.name == container
                            && s.state
                                .and_then(|st| st.terminated)
                                .is_some_and(|t| t.exit_code == 0)
                    })
            },
        );
        let leaf_pod: k8s_openapi::api::core::v1::Pod = e.sandbox.leaves["leaf-2"]
            .api
            .store()
            .get_typed("default", "demo-2")
            .expect("leaf pod");
        let names: Vec<String> = leaf_pod
            .spec
            .and_then(|s| s.ephemeral_containers)
            .into_iter()
            .flatten()
            .map(|c| c.name)
            .collect();
        assert!(names.contains(&container), "{names:?}");
    }
}
