//! API calls on a client stack of relaylet's own, without a `kube::Client` around it.
//!
//! Every `kube::Client` puts its stack behind a tower `Buffer`: a worker task and a channel
//! whose first block holds 32 requests (about 9.3 KiB, allocated with the client). A replica
//! keeps an API client for each leaf it serves (and a stream client for each leaf with
//! sessions), so that block is a sizeable part of the memory per leaf served (see
//! docs/performance.md, "Fleets"). A leaf's calls only need what kube does around a request:
//! send it, turn a 4xx/5xx answer into `kube::Error::Api` with the server's `Status`, read a
//! JSON answer. [`Calls`] does that on a cloneable stack, with the same errors as kube's
//! client, so callers read the same errors either way. The root keeps its `kube::Client`
//! (one per replica); [`Calls::of_client`] lets code shared by both (`kube_client::lean_watch`) take
//! either.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ObjectList, PartialObjectMeta, Status};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceExt};

/// An answer's body, as it comes.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

type Stack = BoxCloneSyncService<Request<kube::client::Body>, Response<Body>, BoxError>;

/// Calls to one cluster's apiserver. Cheap to clone (the stack is cloned per call).
#[derive(Clone)]
pub struct Calls(Stack);

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Calls")
    }
}

impl Calls {
    /// Calls on `service` (kube's layers over an HTTP client: `kube_client::stack`).
    pub fn new<S, B>(service: S) -> Calls
    where
        S: Service<Request<kube::client::Body>, Response = Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let service = service
            .map_response(|response: Response<B>| {
                response.map(|body| body.map_err(Into::into).boxed_unsync())
            })
            .map_err(Into::into);
        Calls(BoxCloneSyncService::new(service))
    }

    /// Calls through `client` (the root's `kube::Client`).
    pub fn of_client(client: Client) -> Calls {
        Calls::new(tower::service_fn(move |request| {
            let client = client.clone();
            async move {
                let response = client.send(request).await?;
                Ok::<_, kube::Error>(response)
            }
        }))
    }

    /// A `kube::Client` on these calls (its `Buffer` and all), for code that wants one (`Api`).
    pub fn into_client(self, default_namespace: String) -> Client {
        Client::new(self.0, default_namespace)
    }

    /// Sends `request` and returns the answer as it comes, whatever its status.
    pub async fn send(
        &self,
        request: Request<kube::client::Body>,
    ) -> Result<Response<Body>, kube::Error> {
        self.0.clone().oneshot(request).await.map_err(|err| {
            // As kube's own client: an error of kube's layers (auth) as itself, hyper's as
            // hyper's, any other as the service's.
            err.downcast::<kube::Error>()
                .map(|e| *e)
                .or_else(|err| {
                    err.downcast::<hyper::Error>()
                        .map(|e| kube::Error::HyperError(*e))
                })
                .unwrap_or_else(kube::Error::Service)
        })
    }

    /// Sends `request`; a 4xx/5xx answer is `kube::Error::Api` with the server's `Status` (or
    /// one made of its text, if it sent none), as kube's client reads it.
    pub async fn send_ok(
        &self,
        request: Request<kube::client::Body>,
    ) -> Result<Response<Body>, kube::Error> {
        let response = self.send(request).await?;
        let status = response.status();
        if !(status.is_client_error() || status.is_server_error()) {
            return Ok(response);
        }
        let text = collect(response.into_body()).await?;
        let text = String::from_utf8_lossy(&text);
        let status = serde_json::from_str::<Status>(&text).unwrap_or_else(|_| {
            Status::failure(text.trim(), "Failed to parse error data").with_code(status.as_u16())
        });
        Err(kube::Error::Api(status.boxed()))
    }

    /// The answer to `request` as text.
    pub async fn request_text(&self, request: Request<Vec<u8>>) -> Result<String, kube::Error> {
        let response = self.send_ok(request.map(kube::client::Body::from)).await?;
        let bytes = collect(response.into_body()).await?;
        String::from_utf8(bytes.to_vec()).map_err(kube::Error::FromUtf8)
    }

    /// The answer to `request`, read as JSON.
    pub async fn request<T: DeserializeOwned>(
        &self,
        request: Request<Vec<u8>>,
    ) -> Result<T, kube::Error> {
        let response = self.send_ok(request.map(kube::client::Body::from)).await?;
        let bytes = collect(response.into_body()).await?;
        serde_json::from_slice(&bytes).map_err(kube::Error::SerdeError)
    }

    /// The metadata of the `K` called `name` in `namespace`, or `None` if there is none (as
    /// kube's `Api::get_metadata_opt`).
    pub async fn get_metadata_opt<K>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PartialObjectMeta<K>>, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let request = kube::core::Request::new(K::url_path(&(), Some(namespace)))
            .get_metadata(name, &Default::default())
            .map_err(kube::Error::BuildRequest)?;
        match self.request(request).await {
            Ok(meta) => Ok(Some(meta)),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The `K` called `name` (in `namespace`, for a namespaced kind), or `None` if there is none.
    pub async fn get_opt<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<K>, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let request = kube::core::Request::new(K::url_path(&(), namespace))
            .get(name, &Default::default())
            .map_err(kube::Error::BuildRequest)?;
        match self.request(request).await {
            Ok(object) => Ok(Some(object)),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Creates `object` (in `namespace`, for a namespaced kind); the object as created.
    pub async fn create<K>(
        &self,
        namespace: Option<&str>,
        object: &K,
        params: &PostParams,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Serialize,
    {
        let data = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
        let request = kube::core::Request::new(K::url_path(&(), namespace))
            .create(params, data)
            .map_err(kube::Error::BuildRequest)?;
        self.request(request).await
    }

    /// Patches the `K` called `name` in `namespace` with `patch`; the object as patched.
    pub async fn patch<K, P>(
        &self,
        namespace: Option<&str>,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
        P: Serialize + std::fmt::Debug,
    {
        let request = kube::core::Request::new(K::url_path(&(), namespace))
            .patch(name, params, patch)
            .map_err(kube::Error::BuildRequest)?;
        self.request(request).await
    }

    /// Deletes the `K` called `name` in `namespace` as `params` say (grace, preconditions);
    /// `false` when there was none.
    pub async fn delete<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        params: &DeleteParams,
    ) -> Result<bool, kube::Error>
    where
        K: Resource<DynamicType = ()>,
    {
        let request = kube::core::Request::new(K::url_path(&(), namespace))
            .delete(name, params)
            .map_err(kube::Error::BuildRequest)?;
        match self.request_text(request).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// A page of the metadata of every `K` `params` select, in `namespace` or (`None`) every
    /// namespace (as kube's `Api::list_metadata`).
    pub async fn list_metadata<K>(
        &self,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<ObjectList<PartialObjectMeta<K>>, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Clone,
    {
        let request = kube::core::Request::new(K::url_path(&(), namespace))
            .list_metadata(params)
            .map_err(kube::Error::BuildRequest)?;
        self.request(request).await
    }

    /// The apiserver's version (`GET /version`).
    pub async fn version(
        &self,
    ) -> Result<k8s_openapi::apimachinery::pkg::version::Info, kube::Error> {
        let request = Request::get("/version")
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        self.request(request).await
    }
}

async fn collect(body: Body) -> Result<Bytes, kube::Error> {
    body.collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(body_error)
}

/// The error of reading an answer's body: kube's own (the root's client) as itself.
pub fn body_error(err: BoxError) -> kube::Error {
    err.downcast::<kube::Error>()
        .map(|e| *e)
        .unwrap_or_else(kube::Error::Service)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn answering(code: u16, body: &'static str) -> Calls {
        Calls::new(tower::service_fn(
            move |_: Request<kube::client::Body>| async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(code)
                        .body(http_body_util::Full::new(Bytes::from_static(
                            body.as_bytes(),
                        )))
                        .expect("a response"),
                )
            },
        ))
    }

    fn get() -> Request<Vec<u8>> {
        Request::get("/version")
            .body(Vec::new())
            .expect("a request")
    }

    #[tokio::test]
    async fn a_json_answer_is_read() {
        let calls = answering(
            200,
            r#"{"major":"1","minor":"35","gitVersion":"v1.35.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#,
        );
        let info = calls.version().await.expect("the version");
        assert_eq!(info.git_version, "v1.35.0");
    }

    #[tokio::test]
    async fn an_error_answer_is_the_servers_status() {
        let calls = answering(
            403,
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods is forbidden","reason":"Forbidden","code":403}"#,
        );
        match calls.request_text(get()).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403);
                assert_eq!(status.reason, "Forbidden");
                assert_eq!(status.message, "pods is forbidden");
            }
            other => panic!("expected the server's Status, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_error_answer_without_a_status_keeps_its_code_and_text() {
        let calls = answering(502, "bad gateway\n");
        match calls.request_text(get()).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 502);
                assert_eq!(status.message, "bad gateway");
            }
            other => panic!("expected a Status made of the text, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_service_error_is_the_services() {
        let calls = Calls::new(tower::service_fn(|_: Request<kube::client::Body>| async {
            Err::<Response<http_body_util::Empty<Bytes>>, _>(std::io::Error::other("refused"))
        }));
        match calls.request_text(get()).await {
            Err(kube::Error::Service(err)) => assert_eq!(err.to_string(), "refused"),
            other => panic!("expected the service's error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_2xx_answer_that_is_not_json_is_a_serde_error() {
        let calls = answering(200, "not json");
        assert!(matches!(
            calls.version().await,
            Err(kube::Error::SerdeError(_))
        ));
    }
}
