module relaylet.test/realk8s/konnectivity

go 1.25.0

require sigs.k8s.io/apiserver-network-proxy v0.34.0

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/emicklei/go-restful/v3 v3.12.2 // indirect
	github.com/fxamacker/cbor/v2 v2.9.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-openapi/jsonpointer v0.21.0 // indirect
	github.com/go-openapi/jsonreference v0.20.2 // indirect
	github.com/go-openapi/swag v0.23.0 // indirect
	github.com/google/gnostic-models v0.7.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/josharian/intern v1.0.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/mailru/easyjson v0.7.7 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/prometheus/client_golang v1.23.0 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/spf13/cobra v1.10.1 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	golang.org/x/net v0.47.0 // indirect
	golang.org/x/oauth2 v0.30.0 // indirect
	golang.org/x/sys v0.38.0 // indirect
	golang.org/x/term v0.37.0 // indirect
	golang.org/x/text v0.31.0 // indirect
	golang.org/x/time v0.9.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250303144028-a0af3efb3deb // indirect
	google.golang.org/grpc v1.72.1 // indirect
	google.golang.org/protobuf v1.36.8 // indirect
	gopkg.in/evanphx/json-patch.v4 v4.13.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	k8s.io/api v0.35.4 // indirect
	k8s.io/apimachinery v0.35.4 // indirect
	k8s.io/client-go v0.35.4 // indirect
	k8s.io/component-helpers v0.34.0 // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
	k8s.io/kube-openapi v0.0.0-20250910181357-589584f1c912 // indirect
	k8s.io/utils v0.0.0-20251002143259-bc988d571ff4 // indirect
	sigs.k8s.io/apiserver-network-proxy/konnectivity-client v0.31.0 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.3.0 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

// --- aligned with tests/realk8s/k8s by tests/tools/align-go-pins.sh
replace (
	cel.dev/expr => cel.dev/expr v0.24.0
	cloud.google.com/go/compute/metadata => cloud.google.com/go/compute/metadata v0.7.0
	github.com/creack/pty => github.com/creack/pty v1.1.18
	github.com/davecgh/go-spew => github.com/davecgh/go-spew v1.1.1
	github.com/go-logr/logr => github.com/go-logr/logr v1.4.3
	github.com/google/pprof => github.com/google/pprof v0.0.0-20250403155104-27863c87afa6
	github.com/moby/spdystream => github.com/moby/spdystream v0.5.1
	github.com/onsi/ginkgo/v2 => github.com/onsi/ginkgo/v2 v2.27.2
	github.com/onsi/gomega => github.com/onsi/gomega v1.38.2
	github.com/pmezard/go-difflib => github.com/pmezard/go-difflib v1.0.0
	github.com/prometheus/client_golang => github.com/prometheus/client_golang v1.23.2
	github.com/prometheus/common => github.com/prometheus/common v0.66.1
	github.com/rogpeppe/go-internal => github.com/rogpeppe/go-internal v1.14.1
	github.com/spf13/cobra => github.com/spf13/cobra v1.10.0
	github.com/spf13/pflag => github.com/spf13/pflag v1.0.9
	github.com/stretchr/testify => github.com/stretchr/testify v1.11.1
	github.com/yuin/goldmark => github.com/yuin/goldmark v1.4.13
	go.opentelemetry.io/auto/sdk => go.opentelemetry.io/auto/sdk v1.2.1
	go.opentelemetry.io/otel => go.opentelemetry.io/otel v1.41.0
	go.opentelemetry.io/otel/metric => go.opentelemetry.io/otel/metric v1.41.0
	go.opentelemetry.io/otel/sdk => go.opentelemetry.io/otel/sdk v1.36.0
	go.opentelemetry.io/otel/sdk/metric => go.opentelemetry.io/otel/sdk/metric v1.36.0
	go.opentelemetry.io/otel/trace => go.opentelemetry.io/otel/trace v1.41.0
	go.yaml.in/yaml/v2 => go.yaml.in/yaml/v2 v2.4.3
	golang.org/x/crypto => golang.org/x/crypto v0.45.0
	golang.org/x/mod => golang.org/x/mod v0.29.0
	golang.org/x/net => golang.org/x/net v0.47.0
	golang.org/x/sync => golang.org/x/sync v0.18.0
	golang.org/x/sys => golang.org/x/sys v0.38.0
	golang.org/x/term => golang.org/x/term v0.37.0
	golang.org/x/text => golang.org/x/text v0.31.0
	golang.org/x/tools => golang.org/x/tools v0.38.0
	golang.org/x/xerrors => golang.org/x/xerrors v0.0.0-20200804184101-5ec99f83aff1
	google.golang.org/genproto/googleapis/api => google.golang.org/genproto/googleapis/api v0.0.0-20250303144028-a0af3efb3deb
	google.golang.org/genproto/googleapis/rpc => google.golang.org/genproto/googleapis/rpc v0.0.0-20250528174236-200df99c418a
	google.golang.org/grpc => google.golang.org/grpc v1.72.2
	google.golang.org/protobuf => google.golang.org/protobuf v1.36.8
	gopkg.in/evanphx/json-patch.v4 => gopkg.in/evanphx/json-patch.v4 v4.13.0
	k8s.io/api => k8s.io/api v0.35.4
	k8s.io/apimachinery => k8s.io/apimachinery v0.35.4
	k8s.io/client-go => k8s.io/client-go v0.35.4
	k8s.io/component-base => k8s.io/component-base v0.35.4
	k8s.io/component-helpers => k8s.io/component-helpers v0.35.4
	k8s.io/gengo/v2 => k8s.io/gengo/v2 v2.0.0-20250922181213-ec3ebc5fd46b
	k8s.io/kube-openapi => k8s.io/kube-openapi v0.0.0-20250910181357-589584f1c912
	k8s.io/utils => k8s.io/utils v0.0.0-20251002143259-bc988d571ff4
	sigs.k8s.io/apiserver-network-proxy/konnectivity-client => sigs.k8s.io/apiserver-network-proxy/konnectivity-client v0.31.2
	sigs.k8s.io/json => sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730
)

// --- end of aligned versions
