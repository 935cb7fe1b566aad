//! The API server stand-in: an in-memory kube-apiserver.
