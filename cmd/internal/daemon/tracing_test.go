package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/mailroom/tailer/cmd/internal/config"
)

// Tracing is on only with an OTLP endpoint, off when the SDK's variables
// say so, and a protocol or exporter the tailer does not speak is the
// variable's configuration error.
func TestNewTracing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		on     bool
		badVar string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{"disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, false, ""},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, false, ""},
		{"http/json", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20secret-token"}, true, ""},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"http/protobuf", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, false, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{"endpoint not a URL", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "secret-token@host"}, false, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"headers", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_HEADERS": "secret-token"}, false, "OTEL_EXPORTER_OTLP_HEADERS"},
		{"timeout", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, false, "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{"compression", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, false, "OTEL_EXPORTER_OTLP_COMPRESSION"},
		{"zipkin", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := NewTracing(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			var cerr *config.Error
			switch {
			case tc.badVar != "":
				if !errors.As(err, &cerr) || cerr.Var != tc.badVar || strings.Contains(err.Error(), "secret-token") {
					t.Fatalf("err = %v, want a configuration error of %s that shows no secret", err, tc.badVar)
				}
			case err != nil:
				t.Fatal(err)
			case (tr.Tracer != nil) != tc.on:
				t.Fatalf("tracing on: %v, want %v", tr.Tracer != nil, tc.on)
			default:
				tr.Shutdown()
			}
		})
	}
}
