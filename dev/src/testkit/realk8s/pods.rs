//! The pods the real-Kubernetes suites run: the demo pod (a python process on the leafkubelet's
//! stand-in node), its busybox twin for a real kubelet and containerd (`real_node`), and the
//! manifest both are made from.

/// The demo pod's manifest; `root_uid` marks a leaf copy.
pub fn demo_pod(namespace: &str, name: &str, node: &str, root_uid: Option<&str>) -> String {
    let app = "import http.server, os, sys, time, threading\n\
class H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        body = b'hello from ' + os.environ.get('POD', '?').encode() + b'\\n'\n        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n    def log_message(self, *a): pass\n\
s = http.server.ThreadingHTTPServer(('127.0.0.1', int(os.environ.get('PORT_8080', '0'))), H)\n\
threading.Thread(target=s.serve_forever, daemon=True).start()\n\
def echo():\n    for line in sys.stdin:\n        print('got ' + line.strip(), flush=True)\n\
threading.Thread(target=echo, daemon=True).start()\n\
n = 0\nwhile True:\n    print('tick %d' % n, flush=True); n += 1; time.sleep(1)\n";
    pod_manifest(
        namespace,
        name,
        node,
        root_uid,
        serde_json::json!({
            "name": "main", "image": "local/python:3",
            "command": ["python3", "-u", "-c", app],
            "env": [{"name": "POD", "value": format!("{namespace}/{name}")}],
            "ports": [{"containerPort": 8080}],
            "stdin": true,
        }),
    )
}

/// A pod bound to `node` with one container; `root_uid` marks a leaf copy with the syncer's
/// marker (`counterpart::ROOT_UID_MARKER`).
pub fn pod_manifest(
    namespace: &str,
    name: &str,
    node: &str,
    root_uid: Option<&str>,
    container: serde_json::Value,
) -> String {
    let mut annotations = serde_json::Map::new();
    if let Some(uid) = root_uid {
        annotations.insert(
            relaylet::model::counterpart::ROOT_UID_MARKER.into(),
            uid.into(),
        );
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
        },
    })
    .to_string()
}

/// A pod in a real container that behaves as the demo pod does for the suites' checks
/// ([`demo_pod`]): logs `tick N` every second, answers `got <line>` for each line on its
/// stdin (attach), and serves `hello from <namespace>/<name>` on port 8080 (port-forward), with
/// busybox's sh, httpd and tar (exec, cp). `root_uid` marks a leaf copy.
pub fn busybox_pod(namespace: &str, name: &str, node: &str, root_uid: Option<&str>) -> String {
    let script = "mkdir -p /tmp/www && echo \"hello from $POD\" > /tmp/www/index.html \
        && httpd -p 8080 -h /tmp/www; \
        i=0; while true; do echo \"tick $i\"; i=$((i+1)); \
        if read -t 1 line; then echo \"got $line\"; fi; done";
    let manifest = pod_manifest(
        namespace,
        name,
        node,
        root_uid,
        serde_json::json!({
            "name": "main",
            "image": super::real_node::BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "env": [{"name": "POD", "value": format!("{namespace}/{name}")}],
            "ports": [{"containerPort": 8080}],
            "stdin": true,
        }),
    );
    let mut pod: serde_json::Value = serde_json::from_str(&manifest).expect("a pod manifest");
    // The leaf runs no controller-manager, so no ServiceAccount token to mount.
    pod["spec"]["automountServiceAccountToken"] = false.into();
    pod.to_string()
}
