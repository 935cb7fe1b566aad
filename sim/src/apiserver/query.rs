//! Query parameters of one request, in order with repeated keys kept (exec's `command`).

use axum::extract::Request;

use super::failure::Failure;

/// Query parameters in order (repeated keys kept).
pub(super) struct Query(pub(super) Vec<(String, String)>);

impl Query {
    pub(super) fn parse(req: &Request) -> Result<Self, Failure> {
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(req.uri())
            .map(|q| Query(q.0))
            .map_err(|e| Failure::bad_request(format!("invalid query: {e}")))
    }

    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}
