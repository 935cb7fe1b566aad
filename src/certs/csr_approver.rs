//! The opt-in approver of relaylet's own serving-certificate CSRs
//! (`SERVING_CERT_CSR_APPROVER=true`, chart `servingCert.csr.approver=true`).
//!
//! kube-controller-manager never approves `kubernetes.io/kubelet-serving` CSRs by itself, and
//! the usual external approvers only approve those a node itself requested. Every replica runs
//! this approver (the first replica has no certificate and no leader yet, so it cannot wait for
//! one). It approves a pending CSR only when all of these hold:
//! - it was made by relaylet's own identity (the user this process authenticates as), with a
//!   ServiceAccount token bound to a pod (`authentication.kubernetes.io/pod-name`/`pod-uid`);
//! - that pod exists in relaylet's namespace with that UID and is not being deleted;
//! - the request is for the kubelet-serving signer with its exact subject
//!   (`O=system:nodes`, `CN=system:node:<that pod's name>`) and usages;
//! - its IP SANs are that pod's IPs, its DNS SANs are relaylet's virtual nodes, nothing else.
//!
//! Anything else from another requester is left alone (another approver's business); a CSR from
//! relaylet's identity that fails a check is left pending, counted and logged with the reason.
//! Approving needs `approve` on the signer, which would also let a compromised relaylet approve
//! other kubelet-serving CSRs: docs/install.md, "Serving certificates from the cluster CA",
//! says so.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::certs::serving_csr::{COMMON_NAME_PREFIX, ORGANIZATION, SIGNER, ip_from_bytes};
use crate::ops::Metrics;

const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// Refused CSRs remembered so a re-list does not count them again; cleared when this full.
const MAX_REMEMBERED: usize = 1024;

/// What the approver does with one CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not relaylet's: another requester or signer, or already decided.
    NotOurs,
    /// relaylet's identity asked for something it must not get; left pending.
    Refuse(String),
    Approve,
}

/// Approves relaylet's own CSRs (see the module comment) until the task is dropped.
///
/// `nodes` names the virtual nodes relaylet serves now (a CSR may name only those).
pub async fn run(
    root: Client,
    namespace: String,
    nodes: impl Fn() -> BTreeSet<String>,
    metrics: Metrics,
) {
    let own = loop {
        match whoami(&root).await {
            Ok(user) => break user,
            Err(err) => {
                tracing::warn!(%err, "CSR approver: asking the root apiserver who relaylet is failed; retrying");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    tracing::info!(identity = %own, signer = SIGNER, "CSR approver started");
    let csrs: Api<CertificateSigningRequest> = Api::all(root.clone());
    let pods: Api<Pod> = Api::namespaced(root, &namespace);
    let config = watcher::Config::default().fields(&format!("spec.signerName={SIGNER}"));
    let mut refused: HashSet<String> = HashSet::new();
    let mut events = std::pin::pin!(
        watcher(csrs.clone(), config)
            .default_backoff()
            .applied_objects()
    );
    while let Some(event) = events.next().await {
        let csr = match event {
            Ok(csr) => csr,
            Err(err) => {
                tracing::warn!(%err, "CSR approver: watching CSRs failed; retrying");
                continue;
            }
        };
        let uid = csr.metadata.uid.clone().unwrap_or_default();
        if refused.contains(&uid) || is_decided(&csr) {
            continue;
        }
        let name = csr.metadata.name.clone().unwrap_or_default();
        let pod = match requester_pod(&csr, &own) {
            Some(pod_name) => match pods.get_opt(&pod_name).await {
                Ok(pod) => pod,
                Err(err) => {
                    tracing::warn!(csr = %name, %err, "CSR approver: reading the requesting pod failed");
                    continue;
                }
            },
            None => None,
        };
        match decide(&csr, &own, &namespace, pod.as_ref(), &nodes()) {
            Verdict::NotOurs => {}
            Verdict::Refuse(why) => {
                tracing::warn!(csr = %name, reason = %why, "CSR approver: not approving a CSR made by relaylet's identity");
                metrics.csr_approver_decision("refused");
                if refused.len() >= MAX_REMEMBERED {
                    refused.clear();
                }
                refused.insert(uid);
            }
            Verdict::Approve => match approve(&csrs, csr).await {
                Ok(()) => {
                    tracing::info!(csr = %name, "CSR approver: approved relaylet's serving-certificate CSR");
                    metrics.csr_approver_decision("approved");
                }
                // Another replica approved it first, or it changed: the next event decides.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(err) => {
                    tracing::warn!(csr = %name, %err, "CSR approver: approving failed");
                }
            },
        }
    }
}

/// The user this process authenticates to the root apiserver as.
async fn whoami(root: &Client) -> Result<String, kube::Error> {
    let review = Api::<SelfSubjectReview>::all(root.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}

/// The pod whose bound token made `csr`, when `own` made it.
fn requester_pod(csr: &CertificateSigningRequest, own: &str) -> Option<String> {
    if csr.spec.username.as_deref() != Some(own) {
        return None;
    }
    single_extra(csr, POD_NAME_EXTRA)
}

fn single_extra(csr: &CertificateSigningRequest, key: &str) -> Option<String> {
    match csr.spec.extra.as_ref()?.get(key)?.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

fn is_decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .is_some_and(|s| s.certificate.is_some() || s.conditions.iter().flatten().next().is_some())
}

/// Decides on `csr`, given relaylet's identity `own`, its `namespace`, the pod the requester's
/// token was bound to (`None` when there is none) and relaylet's virtual nodes.
pub fn decide(
    csr: &CertificateSigningRequest,
    own: &str,
    namespace: &str,
    pod: Option<&Pod>,
    virtual_nodes: &BTreeSet<String>,
) -> Verdict {
    if csr.spec.username.as_deref() != Some(own)
        || csr.spec.signer_name != SIGNER
        || is_decided(csr)
    {
        return Verdict::NotOurs;
    }
    match check(csr, namespace, pod, virtual_nodes) {
        Ok(()) => Verdict::Approve,
        Err(why) => Verdict::Refuse(why),
    }
}

fn check(
    csr: &CertificateSigningRequest,
    namespace: &str,
    pod: Option<&Pod>,
    virtual_nodes: &BTreeSet<String>,
) -> Result<(), String> {
    let (Some(pod_name), Some(pod_uid)) = (
        single_extra(csr, POD_NAME_EXTRA),
        single_extra(csr, POD_UID_EXTRA),
    ) else {
        return Err(format!(
            "it was not made with a token bound to a pod (no {POD_NAME_EXTRA}); approve it by hand if it is right"
        ));
    };
    let pod = pod
        .filter(|p| {
            p.metadata.name.as_deref() == Some(pod_name.as_str())
                && p.metadata.uid.as_deref() == Some(pod_uid.as_str())
        })
        .ok_or_else(|| {
            format!("its requester's pod {namespace}/{pod_name} (uid {pod_uid}) does not exist")
        })?;
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(format!(
            "its requester's pod {namespace}/{pod_name} is being deleted"
        ));
    }
    let pod_ips: BTreeSet<IpAddr> = pod
        .status
        .iter()
        .flat_map(|s| {
            s.pod_ips
                .iter()
                .flatten()
                .map(|ip| ip.ip.clone())
                .chain(s.pod_ip.clone())
        })
        .filter_map(|ip| ip.parse().ok())
        .collect();

    let usages: BTreeSet<&str> = csr
        .spec
        .usages
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    let without_rsa: BTreeSet<&str> = ["digital signature", "server auth"].into();
    let with_rsa: BTreeSet<&str> = ["digital signature", "key encipherment", "server auth"].into();
    if usages != without_rsa && usages != with_rsa {
        return Err(format!(
            "its usages {usages:?} are not a kubelet serving certificate's"
        ));
    }

    let request = Request::parse(&csr.spec.request.0)?;
    if request.organizations != [ORGANIZATION] {
        return Err(format!(
            "its subject organization {:?} is not [{ORGANIZATION:?}]",
            request.organizations
        ));
    }
    let expected_cn = format!("{COMMON_NAME_PREFIX}{pod_name}");
    if request.common_name != expected_cn {
        return Err(format!(
            "its common name {:?} is not {expected_cn:?}",
            request.common_name
        ));
    }
    if request.other_names {
        return Err("it asks for e-mail, URI or other names".to_string());
    }
    if request.ips.is_empty() {
        return Err("it names no IP address".to_string());
    }
    if let Some(ip) = request.ips.iter().find(|ip| !pod_ips.contains(ip)) {
        return Err(format!(
            "it names IP {ip}, which is not an IP of pod {namespace}/{pod_name} ({pod_ips:?})"
        ));
    }
    if let Some(name) = request.dns.iter().find(|n| !virtual_nodes.contains(*n)) {
        return Err(format!(
            "it names {name:?}, which is not one of relaylet's virtual nodes"
        ));
    }
    Ok(())
}

/// What a PEM certificate request asks for.
#[derive(Debug, Default)]
struct Request {
    organizations: Vec<String>,
    common_name: String,
    ips: Vec<IpAddr>,
    dns: Vec<String>,
    /// E-mail, URI or any other kind of name.
    other_names: bool,
}

impl Request {
    fn parse(pem: &[u8]) -> Result<Request, String> {
        use x509_parser::extensions::{GeneralName, ParsedExtension};
        use x509_parser::prelude::FromDer;
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem)
            .map_err(|e| format!("its request is not PEM: {e}"))?;
        if pem.label != "CERTIFICATE REQUEST" {
            return Err(format!(
                "its request is a {:?}, not a CERTIFICATE REQUEST",
                pem.label
            ));
        }
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
                .map_err(|e| format!("its request does not parse: {e}"))?;
        let subject = &csr.certification_request_info.subject;
        let text = |v: &x509_parser::x509::AttributeTypeAndValue<'_>| {
            v.as_str().map(str::to_string).unwrap_or_default()
        };
        let common_names: Vec<String> = subject.iter_common_name().map(text).collect();
        let mut request = Request {
            organizations: subject.iter_organization().map(text).collect(),
            common_name: match common_names.as_slice() {
                [one] => one.clone(),
                _ => String::new(),
            },
            ..Request::default()
        };
        for extension in csr.requested_extensions().into_iter().flatten() {
            if let ParsedExtension::SubjectAlternativeName(san) = extension {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(n) => request.dns.push(n.to_string()),
                        GeneralName::IPAddress(bytes) => match ip_from_bytes(bytes) {
                            Some(ip) => request.ips.push(ip),
                            None => request.other_names = true,
                        },
                        _ => request.other_names = true,
                    }
                }
            }
        }
        Ok(request)
    }
}

/// Approves `csr` through its approval subresource (what `kubectl certificate approve` does).
async fn approve(
    api: &Api<CertificateSigningRequest>,
    mut csr: CertificateSigningRequest,
) -> Result<(), kube::Error> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let status = csr.status.get_or_insert_with(Default::default);
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: "Approved".to_string(),
            status: "True".to_string(),
            reason: Some("RelayletApprove".to_string()),
            message: Some(
                "relaylet approved its replica's serving certificate: requested by its pod's bound token, for that pod's IP and relaylet's virtual nodes"
                    .to_string(),
            ),
            last_update_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
    api.replace_subresource("approval", &name, &PostParams::default(), &csr)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::serving_csr::{Subject, USAGES, request_pem};
    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec;
    use k8s_openapi::api::core::v1::{PodIP, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const OWN: &str = "system:serviceaccount:relaylet:relaylet";
    const NS: &str = "relaylet";

    fn nodes() -> BTreeSet<String> {
        ["relaylet-leaf-1".to_string(), "relaylet-leaf-2".to_string()].into()
    }

    fn pod(name: &str, uid: &str, ip: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                pod_ips: Some(vec![PodIP { ip: ip.into() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The CSR relaylet's replica `pod_name` makes for `ip` (what `serving_csr` sends), as the
    /// apiserver stores it for a requester with a bound token.
    fn csr(pod_name: &str, ip: &str, names: &BTreeSet<String>) -> CertificateSigningRequest {
        let key = rcgen::KeyPair::generate().unwrap();
        let subject = Subject {
            name: pod_name.into(),
            ip: ip.parse().unwrap(),
        };
        stored(request_pem(&subject, names, &key).unwrap(), pod_name)
    }

    fn stored(pem: String, pod_name: &str) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(format!("{pod_name}-abcde")),
                uid: Some("csr-uid".into()),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: SIGNER.into(),
                usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
                username: Some(OWN.into()),
                extra: Some(
                    [
                        (POD_NAME_EXTRA.to_string(), vec![pod_name.to_string()]),
                        (POD_UID_EXTRA.to_string(), vec!["pod-uid".to_string()]),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            status: None,
        }
    }

    /// A request for relaylet-0 at 10.0.0.7 with organization `o` and `extra` names, made by
    /// hand (not by `serving_csr`).
    fn hand_made(o: &str, extra: &[rcgen::SanType]) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("10.0.0.7".parse().unwrap()));
        params.subject_alt_names.extend(extra.iter().cloned());
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, o);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:relaylet-0");
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn verdict(csr: &CertificateSigningRequest, pod: Option<&Pod>) -> Verdict {
        decide(csr, OWN, NS, pod, &nodes())
    }

    fn refused_because(v: Verdict, words: &str) {
        match v {
            Verdict::Refuse(why) => assert!(why.contains(words), "{why:?} lacks {words:?}"),
            other => panic!("expected a refusal ({words}), got {other:?}"),
        }
    }

    #[test]
    fn relaylets_own_request_from_its_pod_is_approved() {
        let p = pod("relaylet-0", "pod-uid", "10.0.0.7");
        assert_eq!(
            verdict(&csr("relaylet-0", "10.0.0.7", &nodes()), Some(&p)),
            Verdict::Approve
        );
        // Naming no virtual node (a fresh install) is fine too: the IP is what is dialled.
        assert_eq!(
            verdict(&csr("relaylet-0", "10.0.0.7", &BTreeSet::new()), Some(&p)),
            Verdict::Approve
        );
    }

    #[test]
    fn other_requesters_signers_and_decided_requests_are_left_alone() {
        let p = pod("relaylet-0", "pod-uid", "10.0.0.7");
        let mut c = csr("relaylet-0", "10.0.0.7", &nodes());
        c.spec.username = Some("system:node:worker-1".into());
        assert_eq!(verdict(&c, Some(&p)), Verdict::NotOurs);
        let mut c = csr("relaylet-0", "10.0.0.7", &nodes());
        c.spec.signer_name = "kubernetes.io/kube-apiserver-client".into();
        assert_eq!(verdict(&c, Some(&p)), Verdict::NotOurs);
        let mut c = csr("relaylet-0", "10.0.0.7", &nodes());
        c.status = Some(Default::default());
        c.status.as_mut().unwrap().conditions = Some(vec![CertificateSigningRequestCondition {
            type_: "Denied".into(),
            status: "True".into(),
            ..Default::default()
        }]);
        assert_eq!(verdict(&c, Some(&p)), Verdict::NotOurs);
    }

    #[test]
    fn a_foreign_ip_is_refused() {
        let p = pod("relaylet-0", "pod-uid", "10.0.0.7");
        refused_because(
            verdict(&csr("relaylet-0", "10.0.0.99", &nodes()), Some(&p)),
            "10.0.0.99, which is not an IP of pod relaylet/relaylet-0",
        );
    }

    #[test]
    fn a_name_that_is_not_a_virtual_node_is_refused() {
        let p = pod("relaylet-0", "pod-uid", "10.0.0.7");
        let names: BTreeSet<String> = ["kubernetes.default.svc".to_string()].into();
        refused_because(
            verdict(&csr("relaylet-0", "10.0.0.7", &names), Some(&p)),
            "\"kubernetes.default.svc\", which is not one of relaylet's virtual nodes",
        );
    }

    #[test]
    fn a_token_not_bound_to_a_live_pod_is_refused() {
        let p = pod("relaylet-0", "pod-uid", "10.0.0.7");
        let mut c = csr("relaylet-0", "10.0.0.7", &nodes());
        c.spec.extra = None;
        refused_because(
            verdict(&c, Some(&p)),
            "not made with a token bound to a pod",
        );
        let c = csr("relaylet-0", "10.0.0.7", &nodes());
        refused_because(verdict(&c, None), "does not exist");
        let other_uid = pod("relaylet-0", "another-uid", "10.0.0.7");
        refused_because(verdict(&c, Some(&other_uid)), "does not exist");
        let mut dying = p.clone();
        dying.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        refused_because(verdict(&c, Some(&dying)), "is being deleted");
    }

    #[test]
    fn another_pods_name_or_a_wrong_subject_is_refused() {
        let p = pod("relaylet-0", "pod-uid", "10.0.0.7");
        // Made by relaylet-0's token but naming relaylet-1 (or a real node).
        let mut c = csr("relaylet-1", "10.0.0.7", &nodes());
        c.spec.extra = csr("relaylet-0", "10.0.0.7", &nodes()).spec.extra;
        refused_because(
            verdict(&c, Some(&p)),
            "common name \"system:node:relaylet-1\" is not \"system:node:relaylet-0\"",
        );
        // Another organization (system:masters would make it a cluster admin's certificate).
        let pem = hand_made("system:masters", &[]);
        refused_because(
            verdict(&stored(pem, "relaylet-0"), Some(&p)),
            "organization [\"system:masters\"]",
        );
        let mut c = csr("relaylet-0", "10.0.0.7", &nodes());
        c.spec.usages = Some(vec!["digital signature".into(), "client auth".into()]);
        refused_because(verdict(&c, Some(&p)), "usages");
    }

    #[test]
    fn e_mail_and_uri_names_are_refused() {
        let p = pod("relaylet-0", "pod-uid", "10.0.0.7");
        let uri = rcgen::SanType::URI("spiffe://x/y".try_into().unwrap());
        let pem = hand_made(ORGANIZATION, &[uri]);
        refused_because(
            verdict(&stored(pem, "relaylet-0"), Some(&p)),
            "e-mail, URI or other names",
        );
    }
}
