package daemon

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// What the exporter sends is OTLP/JSON as the OpenTelemetry Collector
// reads it (its own decoder): ids, parent, kind, times, attributes of each
// type, an error status; gzipped, with the configured headers.
func TestOTLPExporter(t *testing.T) {
	var got ptrace.Traces
	var auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		zr, err := gzip.NewReader(r.Body)
		if err != nil || r.Header.Get("Content-Encoding") != "gzip" {
			http.Error(w, "not gzip", http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(zr)
		if got, err = (&ptrace.JSONUnmarshaler{}).UnmarshalTraces(body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	env := map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/v1/traces", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
		"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0ken"}
	exp, err := newOTLPExporter(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 1}, SpanID: trace.SpanID{0x00, 0xf0, 2}, TraceFlags: trace.FlagsSampled, Remote: true})
	_, span := tp.Tracer("test").Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "mailroom.publish",
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.Int("mailroom.tokens", 3), attribute.String("s", "v"), attribute.Bool("b", true), attribute.Float64("f", 1.5)))
	span.SetStatus(codes.Error, "refused")
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if auth != "Bearer t0ken" || got.SpanCount() != 1 {
		t.Fatalf("authorization %q, %d spans", auth, got.SpanCount())
	}
	s := got.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
	tokens, _ := s.Attributes().Get("mailroom.tokens")
	str, _ := s.Attributes().Get("s")
	b, _ := s.Attributes().Get("b")
	f, _ := s.Attributes().Get("f")
	switch {
	case s.TraceID() != [16]byte(parent.TraceID()) || s.ParentSpanID() != [8]byte(parent.SpanID()) || s.Name() != "mailroom.publish":
		t.Errorf("span %s of trace %s under %s", s.Name(), s.TraceID(), s.ParentSpanID())
	case s.Kind() != ptrace.SpanKindProducer || s.EndTimestamp() < s.StartTimestamp() || s.StartTimestamp() == 0:
		t.Errorf("kind %v, %d..%d", s.Kind(), s.StartTimestamp(), s.EndTimestamp())
	case tokens.Int() != 3 || str.Str() != "v" || !b.Bool() || f.Double() != 1.5:
		t.Errorf("attributes %v", s.Attributes().AsRaw())
	case s.Status().Code() != ptrace.StatusCodeError || s.Status().Message() != "refused":
		t.Errorf("status %v %q", s.Status().Code(), s.Status().Message())
	}
	// A receiver that refuses is an error of the export.
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) })
	if err := exp.ExportSpans(context.Background(), []sdktrace.ReadOnlySpan{span.(sdktrace.ReadOnlySpan)}); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("export to a refusing receiver: %v", err)
	}
}

// An export that fails says so without the endpoint's user information
// (net/http's errors mask a URL's password; the exporter adds none).
func TestOTLPExportErrorShowsNoCredentials(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.Listener.Addr().String()
	srv.Close() // nothing listens there now
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:s3cret-pw@" + addr}
	exp, err := newOTLPExporter(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider()
	_, span := tp.Tracer("test").Start(context.Background(), "x")
	span.End()
	err = exp.ExportSpans(context.Background(), []sdktrace.ReadOnlySpan{span.(sdktrace.ReadOnlySpan)})
	if err == nil || strings.Contains(err.Error(), "s3cret-pw") {
		t.Fatalf("export to nothing: %v", err)
	}
}
