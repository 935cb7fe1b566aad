//! End to end with kube-rs (`AttachedProcess` over WebSocket, as library users call exec) and
//! with direct kubelet-API calls to relaylet made the way the root apiserver makes them.

use relaylet_dev::testkit as support;

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use relaylet_dev::sandbox::{Settings, kube_client};
use support::{Env, RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn settings() -> Settings {
    Settings::default()
}

async fn root_pods(e: &Env) -> Api<Pod> {
    let client = kube_client(&e.sandbox.root.admin_kubeconfig().unwrap())
        .await
        .unwrap();
    Api::namespaced(client, "default")
}

/// Runs `cmd` in `pod` through the root apiserver; returns stdout, stderr and the exit Status.
async fn exec(
    pods: &Api<Pod>,
    pod: &str,
    cmd: &[&str],
) -> (
    Vec<u8>,
    Vec<u8>,
    Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>,
) {
    let mut process = pods
        .exec(
            pod,
            cmd.to_vec(),
            &AttachParams::default().stdout(true).stderr(true),
        )
        .await
        .unwrap_or_else(|e| panic!("exec {cmd:?} in {pod}: {e}"));
    let mut stdout = process.stdout().unwrap();
    let mut stderr = process.stderr().unwrap();
    let status = process.take_status().unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (r1, r2) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
    r1.unwrap();
    r2.unwrap();
    let status = status.await;
    process.join().await.unwrap();
    (out, err, status)
}

fn exit_code(status: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>) -> i32 {
    match status {
        Some(s) if s.status.as_deref() == Some("Success") => 0,
        Some(s) => s
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .and_then(|c| c.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
            .and_then(|c| c.message.as_deref()?.parse().ok())
            .unwrap_or(-1),
        None => -2,
    }
}

#[test]
fn kube_rs_exec_through_the_root() {
    let e = env(settings);
    RT.block_on(async {
        let pods = root_pods(e).await;
        let (out, err, status) = exec(
            &pods,
            "demo-1",
            &["sh", "-c", "echo via-kube-rs; echo oops >&2; exit 4"],
        )
        .await;
        assert_eq!(out, b"via-kube-rs\n");
        assert_eq!(err, b"oops\n");
        assert_eq!(exit_code(&status), 4, "{status:?}");
        let (out, _, status) = exec(&pods, "demo-2", &["echo", "ok"]).await;
        assert_eq!((out.as_slice(), exit_code(&status)), (&b"ok\n"[..], 0));
    });
}

/// 256 MiB of random bytes through exec arrive byte-identical, with the command's exit status.
///
/// The command exits only once the client has every byte (it waits for a line on stdin). A
/// kubelet closes its connection as soon as the command has exited, with the end of the output
/// possibly still queued in its socket; a client-go ping arriving then (the apiserver's
/// translator pings every 5 s) makes the kubelet's kernel reset the connection and drop that
/// tail. That race is upstream's, with or without relaylet (relaylet reports it as
/// "connection to leaf cluster ... lost", never as success); it is not what this test is about.
#[test]
fn large_exec_output_is_byte_identical() {
    let e = env(settings);
    RT.block_on(async {
        let pods = root_pods(e).await;
        let size = 256 * 1024 * 1024;
        let mut process = pods
            .exec(
                "demo-1",
                vec![
                    "sh",
                    "-c",
                    &format!("head -c {size} /dev/urandom | tee big.bin; read done"),
                ],
                &AttachParams::default()
                    .stdin(true)
                    .stdout(true)
                    .stderr(true),
            )
            .await
            .unwrap();
        let mut stdin = process.stdin().unwrap();
        let mut stdout = process.stdout().unwrap();
        let mut stderr = process.stderr().unwrap();
        let status = process.take_status().unwrap();
        let mut out = vec![0u8; size];
        stdout.read_exact(&mut out).await.unwrap();
        stdin.write_all(b"done\n").await.unwrap();
        stdin.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let mut err = Vec::new();
        let (r1, r2) = tokio::join!(stdout.read_to_end(&mut rest), stderr.read_to_end(&mut err));
        r1.unwrap();
        r2.unwrap();
        let status = status.await;
        process.join().await.unwrap();
        assert_eq!(
            exit_code(&status),
            0,
            "{status:?} {}",
            String::from_utf8_lossy(&err)
        );
        assert_eq!(rest.len(), 0, "more output than was written");
        let local = sha256_hex(&out);
        let (remote, _, status) = exec(
            &pods,
            "demo-1",
            &["sh", "-c", "sha256sum big.bin; rm big.bin"],
        )
        .await;
        assert_eq!(exit_code(&status), 0);
        assert_eq!(
            String::from_utf8_lossy(&remote).split_whitespace().next(),
            Some(local.as_str())
        );
    });
}

fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_hundred_concurrent_sessions_across_both_leaves() {
    let e = env(settings);
    RT.block_on(async {
        let pods = root_pods(e).await;
        let sessions = (0..100).map(|i| {
            let pods = pods.clone();
            async move {
                let pod = if i % 2 == 0 { "demo-1" } else { "demo-2" };
                let script = format!("sleep 0.2; echo session-{i}-$POD_NAME");
                let (out, _, status) = exec(&pods, pod, &["sh", "-c", &script]).await;
                (
                    i,
                    pod,
                    String::from_utf8_lossy(&out).into_owned(),
                    exit_code(&status),
                )
            }
        });
        let results = tokio::time::timeout(Duration::from_secs(120), join_all(sessions))
            .await
            .expect("100 sessions finish");
        for (i, pod, out, code) in results {
            assert_eq!(code, 0, "session {i}");
            assert_eq!(out, format!("session-{i}-{pod}\n"));
        }
    });
}

async fn status_of(client: &kube::Client, path: &str) -> (u16, String) {
    let request = http::Request::post(path).body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(other) => panic!("{path}: {other}"),
    }
}

async fn get_status_of(client: &kube::Client, path: &str) -> (u16, String) {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(other) => panic!("{path}: {other}"),
    }
}

#[test]
fn errors_name_what_is_wrong() {
    let e = env(settings);
    RT.block_on(async {
        let client = e.kubelet_api_client().await;
        let (code, message) = status_of(
            &client,
            "/exec/default/no-such-pod/main?command=true&output=1",
        )
        .await;
        assert_eq!(code, 404);
        assert!(message.contains("default/no-such-pod"), "{message}");

        let (code, message) = status_of(&client, "/exec/default/demo-1/main?output=1").await;
        assert_eq!(code, 400);
        assert!(message.contains("command"), "{message}");

        let (code, message) =
            status_of(&client, "/exec/default/demo-1/main?command=true&output=1").await;
        assert_eq!(
            code, 400,
            "a streaming call without an upgrade is refused: {message}"
        );
        assert!(message.contains("upgrade"), "{message}");

        let (code, _) = status_of(&client, "/configz").await;
        assert_eq!(code, 404);

        // The leaf's refusals come back as the leaf gave them: its validation (422) ...
        let (code, message) =
            get_status_of(&client, "/containerLogs/default/demo-1/main?tailLines=-5").await;
        assert_eq!(code, 422, "{message}");
        // ... and its 404 for a root pod that has no leaf pod behind it.
        let ghost = relaylet_sim::cluster::SimPod {
            namespace: "default".into(),
            name: "ghost".into(),
            containers: vec![relaylet_sim::cluster::SimContainer {
                name: "main".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        e.sandbox
            .root
            .add_pod("relaylet-leaf-1", &ghost)
            .await
            .unwrap();
        let (code, message) = get_status_of(&client, "/containerLogs/default/ghost/main").await;
        assert_eq!(code, 404, "{message}");
        assert_eq!(
            message,
            "pod default/ghost has no counterpart in leaf cluster leaf-1: no pod default/ghost there"
        );
    });
}
