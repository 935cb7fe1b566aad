//! The two clusters a command talks to, each from a context of the user's own kubeconfig
//! (`$KUBECONFIG`, or `~/.kube/config`), as kubectl reads them: the root (where relaylet runs)
//! and, for `join` and `unjoin`, the leaf.

use anyhow::Context as _;
use kube::config::KubeConfigOptions;
use kube::{Client, Config};

/// A cluster reached through one context (`None`: the current one).
pub struct Cluster {
    pub client: Client,
    /// The context's name, for messages.
    pub context: String,
    pub config: Config,
}

impl Cluster {
    pub async fn of(context: Option<&str>, role: &str) -> anyhow::Result<Cluster> {
        let options = KubeConfigOptions {
            context: context.map(str::to_string),
            ..KubeConfigOptions::default()
        };
        let shown = context.unwrap_or("the current context").to_string();
        let config = Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("{role} cluster: reading {shown} from the kubeconfig"))?;
        let client = Client::try_from(config.clone())
            .with_context(|| format!("{role} cluster: a client for {shown}"))?;
        Ok(Cluster {
            client,
            context: shown,
            config,
        })
    }

    /// The apiserver's URL as this context reaches it.
    pub fn server(&self) -> String {
        self.config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string()
    }

    /// The CAs this context trusts for the apiserver, as PEM (none: the system's).
    pub fn ca_pem(&self) -> Option<String> {
        let certs = self.config.root_cert.as_ref()?;
        let mut pem = String::new();
        for der in certs {
            pem.push_str("-----BEGIN CERTIFICATE-----\n");
            let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
            for line in b64.as_bytes().chunks(64) {
                pem.push_str(&String::from_utf8_lossy(line));
                pem.push('\n');
            }
            pem.push_str("-----END CERTIFICATE-----\n");
        }
        Some(pem)
    }
}
