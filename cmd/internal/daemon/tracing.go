package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mailroom/tailer/cmd/internal/config"
)

// Tracing is the tailer's OpenTelemetry tracing, configured by the
// standard OTEL_* variables: on when an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and
// neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none says
// otherwise; spans go over OTLP/HTTP (http/protobuf). Off, the pipeline
// gets no tracer and traced tokens cost one comparison each.
type Tracing struct {
	Tracer   trace.Tracer
	provider *sdktrace.TracerProvider
}

// NewTracing reads the OTEL_* variables through lookupEnv, which must be
// the process's environment (os.LookupEnv): the exporter reads its
// endpoint, headers, timeout and TLS settings from there itself.
func NewTracing(ctx context.Context, lookupEnv func(string) (string, bool)) (*Tracing, error) {
	get := func(k string) string { v, _ := lookupEnv(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") || get("OTEL_TRACES_EXPORTER") == "none" ||
		get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return &Tracing{}, nil
	}
	if e := get("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" {
		return nil, &config.Error{Var: "OTEL_TRACES_EXPORTER", Err: fmt.Errorf("%q: the tailer exports otlp or none", e)}
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := get(k); p != "" {
			if p != "http/protobuf" {
				return nil, &config.Error{Var: k, Err: fmt.Errorf("%q: the tailer exports http/protobuf", p)}
			}
			break
		}
	}
	// The exporter reads the endpoint, headers, timeout, compression and
	// TLS settings from the same variables.
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, &config.Error{Var: "OTEL_EXPORTER_OTLP_ENDPOINT", Err: err}
	}
	// resource.Default reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES;
	// the service is "tailer" unless they name one.
	res := resource.Default()
	if get("OTEL_SERVICE_NAME") == "" && !strings.Contains(get("OTEL_RESOURCE_ATTRIBUTES"), "service.name=") {
		if named, err := resource.Merge(res, resource.NewSchemaless(semconv.ServiceName("tailer"))); err == nil {
			res = named
		}
	}
	// The sampler follows OTEL_TRACES_SAMPLER (default: the parent's
	// decision, the application's traceparent flag).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Tracer: tp.Tracer("github.com/mailroom/tailer"), provider: tp}, nil
}

// Shutdown sends the spans still buffered, waiting at most five seconds.
func (t *Tracing) Shutdown() {
	if t.provider == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.provider.Shutdown(ctx)
}
