package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

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
// otherwise; spans go over OTLP/HTTP, JSON-encoded (otlp.go). Off, the pipeline
// gets no tracer and traced tokens cost one comparison each.
type Tracing struct {
	Tracer   trace.Tracer
	provider *sdktrace.TracerProvider
}

// NewTracing reads the OTEL_* variables through lookupEnv (the SDK reads
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and the sampler's from the
// process's environment itself).
func NewTracing(lookupEnv func(string) (string, bool)) (*Tracing, error) {
	get := func(k string) string { v, _ := lookupEnv(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") || get("OTEL_TRACES_EXPORTER") == "none" ||
		get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return &Tracing{}, nil
	}
	if e := get("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" {
		return nil, &config.Error{Var: "OTEL_TRACES_EXPORTER", Err: fmt.Errorf("%q: the tailer exports otlp or none", e)}
	}
	exp, err := newOTLPExporter(get)
	if err != nil {
		return nil, err
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
