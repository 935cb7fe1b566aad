//! How kube-apiserver proxies pod subresources and node proxy calls to a kubelet.
