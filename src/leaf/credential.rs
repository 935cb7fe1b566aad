//! When a leaf's credential stops working: a service-account token's `exp` claim, or a client
//! certificate's `notAfter`, read from the kubeconfig's current user (the one kube builds the
//! client from). Only that instant leaves this file, never the credential.

use base64::Engine;
use k8s_openapi::jiff::Timestamp;
use kube::config::{AuthInfo, Kubeconfig};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use secrecy::ExposeSecret;

/// When the current user's credential expires, if it says (a token that is not a JWT, or a
/// JWT without `exp`, never expires as far as relaylet can tell).
pub fn expires(kubeconfig: &Kubeconfig) -> Option<Timestamp> {
    let user = current_user(kubeconfig)?;
    if let Some(token) = &user.token {
        return token_expires(token.expose_secret());
    }
    let pem = base64::engine::general_purpose::STANDARD
        .decode(user.client_certificate_data.as_deref()?.trim())
        .ok()?;
    certificate_expires(&pem)
}

fn current_user(kubeconfig: &Kubeconfig) -> Option<&AuthInfo> {
    let context = kubeconfig.current_context.as_deref()?;
    let user = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .user
        .as_deref()?;
    kubeconfig
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()
}

/// A JWT's `exp` (seconds since the epoch), unverified: relaylet only shows it.
pub fn token_expires(token: &str) -> Option<Timestamp> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Timestamp::from_second(claims.get("exp")?.as_i64()?).ok()
}

/// The first certificate's `notAfter` in a PEM bundle.
fn certificate_expires(pem: &[u8]) -> Option<Timestamp> {
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Timestamp::from_second(cert.validity().not_after.timestamp()).ok()
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

    #[test]
    fn a_tokens_exp_is_read_from_the_current_user_only() {
        let token =
            jwt(r#"{"exp":1900000000,"sub":"system:serviceaccount:relaylet:relaylet-leaf"}"#);
        let expires = expires(&kubeconfig(&format!("{{token: '{token}'}}")));
        assert_eq!(expires.map(|t| t.as_second()), Some(1_900_000_000));
    }

    #[test]
    fn tokens_that_say_nothing_never_expire() {
        for token in ["opaque-token", &jwt(r#"{"sub":"x"}"#), "a.%%%.b"] {
            assert_eq!(expires(&kubeconfig(&format!("{{token: '{token}'}}"))), None);
        }
    }

    #[test]
    fn a_client_certificates_not_after_is_read() {
        let mut params = rcgen::CertificateParams::new(vec!["leaf".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 5, 4);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let data = base64::engine::general_purpose::STANDARD.encode(cert.pem());
        let expires = expires(&kubeconfig(&format!(
            "{{client-certificate-data: {data}, client-key-data: {data}}}"
        )));
        assert_eq!(
            expires.map(|t| t.to_string()),
            Some("2031-05-04T00:00:00Z".to_string())
        );
    }
}
