//! A leaf's credential as relaylet renews it: when it stops working (a service-account token's
//! `exp` claim, a client certificate's `notAfter`), when it was issued, and whose token it is,
//! read from the kubeconfig's current user (the one kube builds the client from); a new token
//! for the same ServiceAccount from the leaf (a TokenRequest: the leaf lets relaylet's account
//! request its own tokens only), and the kubeconfig with it. Never logged, never kept beyond
//! the kubeconfig it came in.

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::PostParams;
use kube::config::{AuthInfo, Kubeconfig};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use secrecy::ExposeSecret;

use crate::kube_client::Calls;

/// What relaylet knows of a leaf's credential, from the credential itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub expires: Timestamp,
    /// When it was issued (a token's `iat`, a certificate's `notBefore`).
    pub issued: Option<Timestamp>,
    /// The ServiceAccount (namespace, name) a token is of: the one it can be renewed as.
    pub account: Option<(String, String)>,
}

impl Credential {
    /// When a renewable credential is due for renewal: `fraction` of its life after it was
    /// issued (the kubelet renews its projected tokens at 80 %).
    pub fn renew_at(&self, fraction: f64) -> Option<Timestamp> {
        self.account.as_ref()?;
        let issued = self.issued?;
        let life = self.expires.as_second() - issued.as_second();
        if life <= 0 {
            return None;
        }
        let after = (life as f64 * fraction) as i64;
        Timestamp::from_second(issued.as_second() + after).ok()
    }
}

/// The current user's credential, if it says when it expires (a token that is not a JWT, or a
/// JWT without `exp`, never expires as far as relaylet can tell).
pub fn credential(kubeconfig: &Kubeconfig) -> Option<Credential> {
    let user = current_user(kubeconfig)?;
    if let Some(token) = &user.token {
        return token_credential(token.expose_secret());
    }
    let pem = base64::engine::general_purpose::STANDARD
        .decode(user.client_certificate_data.as_deref()?.trim())
        .ok()?;
    certificate_credential(&pem)
}

/// `kubeconfig` with its current user's token replaced by `token`.
pub fn with_token(mut kubeconfig: Kubeconfig, token: String) -> Option<Kubeconfig> {
    let user = current_user_name(&kubeconfig)?.to_string();
    let info = kubeconfig
        .auth_infos
        .iter_mut()
        .find(|a| a.name == user)?
        .auth_info
        .as_mut()?;
    info.token = Some(token.into());
    Some(kubeconfig)
}

fn current_user_name(kubeconfig: &Kubeconfig) -> Option<&str> {
    let context = kubeconfig.current_context.as_deref()?;
    kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .user
        .as_deref()
}

fn current_user(kubeconfig: &Kubeconfig) -> Option<&AuthInfo> {
    let user = current_user_name(kubeconfig)?;
    kubeconfig
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()
}

/// A JWT's `exp`, `iat` and service account (`sub`), unverified: relaylet only shows them and
/// asks the leaf for a token of the same account, which the leaf checks.
fn token_credential(token: &str) -> Option<Credential> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let time = |key: &str| Timestamp::from_second(claims.get(key)?.as_i64()?).ok();
    let account = claims
        .get("sub")
        .and_then(|s| s.as_str())
        .and_then(|s| s.strip_prefix("system:serviceaccount:"))
        .and_then(|s| s.split_once(':'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'))
        .map(|(ns, name)| (ns.to_string(), name.to_string()));
    Some(Credential {
        expires: time("exp")?,
        issued: time("iat"),
        account,
    })
}

/// The first certificate's validity in a PEM bundle (a certificate is not renewed here).
fn certificate_credential(pem: &[u8]) -> Option<Credential> {
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(Credential {
        expires: Timestamp::from_second(cert.validity().not_after.timestamp()).ok()?,
        issued: Timestamp::from_second(cert.validity().not_before.timestamp()).ok(),
        account: None,
    })
}

/// A new token of `account` (namespace, name) from the leaf, valid as long as `life`; the
/// token and when it expires.
pub async fn request_token(
    leaf: &Calls,
    account: &(String, String),
    life: i64,
) -> Result<(String, Timestamp), kube::Error> {
    let (namespace, name) = account;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(life.max(600)),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let body = serde_json::to_vec(&request).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(ServiceAccount::url_path(&(), Some(namespace)))
        .create_subresource("token", name, &PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    let answer: TokenRequest = leaf.request(request).await?;
    let status = answer.status.ok_or_else(|| {
        kube::Error::Api(
            kube::core::Status::failure("the leaf answered a TokenRequest without a token", "")
                .boxed(),
        )
    })?;
    Ok((status.token, status.expiration_timestamp.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            b64.encode(r#"{"alg":"RS256"}"#),
            b64.encode(claims)
        )
    }

    fn kubeconfig(user: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\n- name: other\n  context: {{cluster: k, user: x}}\nclusters:\n- name: k\n  cluster: {{server: 'https://leaf:6443'}}\nusers:\n- name: x\n  user: {{token: {}}}\n- name: u\n  user: {user}\n",
            jwt(r#"{"exp":1}"#)
        ))
        .unwrap()
    }

    fn token_of(k: &Kubeconfig, user: &str) -> Option<String> {
        let info = k
            .auth_infos
            .iter()
            .find(|a| a.name == user)?
            .auth_info
            .as_ref()?;
        Some(info.token.as_ref()?.expose_secret().to_string())
    }

    #[test]
    fn a_tokens_claims_are_read_from_the_current_user_only() {
        let token = jwt(
            r#"{"exp":1900000000,"iat":1899990000,"sub":"system:serviceaccount:relaylet:relaylet-leaf"}"#,
        );
        let found = credential(&kubeconfig(&format!("{{token: '{token}'}}"))).unwrap();
        assert_eq!(found.expires.as_second(), 1_900_000_000);
        assert_eq!(found.issued.map(|t| t.as_second()), Some(1_899_990_000));
        assert_eq!(
            found.account,
            Some(("relaylet".into(), "relaylet-leaf".into()))
        );
        // 80 % of its 10,000 s life.
        assert_eq!(
            found.renew_at(0.8).map(|t| t.as_second()),
            Some(1_899_998_000)
        );
    }

    #[test]
    fn only_a_service_accounts_token_with_its_issue_time_is_renewed() {
        for claims in [
            r#"{"exp":1900000000,"sub":"system:serviceaccount:relaylet:relaylet-leaf"}"#,
            r#"{"exp":1900000000,"iat":1,"sub":"alice"}"#,
            r#"{"exp":1900000000,"iat":1,"sub":"system:serviceaccount:ns"}"#,
            r#"{"exp":1,"iat":5,"sub":"system:serviceaccount:a:b"}"#,
        ] {
            let found = credential(&kubeconfig(&format!("{{token: '{}'}}", jwt(claims)))).unwrap();
            assert_eq!(found.renew_at(0.8), None, "{claims}");
        }
    }

    #[test]
    fn a_new_token_replaces_the_current_users_only() {
        let k = with_token(kubeconfig("{token: old}"), "new".into()).unwrap();
        assert_eq!(token_of(&k, "u").as_deref(), Some("new"));
        assert_ne!(token_of(&k, "x").as_deref(), Some("new"));
        // As written back into the Secret: the tokens survive kube's serializer.
        let text = serde_json::to_string(&k).unwrap();
        let back = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(token_of(&back, "u").as_deref(), Some("new"));
        assert_eq!(token_of(&back, "x"), token_of(&k, "x"));
    }

    #[test]
    fn tokens_that_say_nothing_never_expire() {
        for token in ["opaque-token", &jwt(r#"{"sub":"x"}"#), "a.%%%.b"] {
            assert_eq!(
                credential(&kubeconfig(&format!("{{token: '{token}'}}"))),
                None
            );
        }
    }

    #[test]
    fn a_client_certificates_not_after_is_read_and_never_renewed() {
        let mut params = rcgen::CertificateParams::new(vec!["leaf".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 5, 4);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let data = base64::engine::general_purpose::STANDARD.encode(cert.pem());
        let found = credential(&kubeconfig(&format!(
            "{{client-certificate-data: {data}, client-key-data: {data}}}"
        )))
        .unwrap();
        assert_eq!(found.expires.to_string(), "2031-05-04T00:00:00Z");
        assert_eq!(found.renew_at(0.8), None);
    }
}
