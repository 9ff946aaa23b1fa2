package daemon

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/mailroom/tailer/cmd/internal/config"
)

// otlpExporter sends spans as OTLP/HTTP with the JSON encoding, which
// OTLP/HTTP receivers (the OpenTelemetry Collector's among them) take
// beside protobuf. Not the SDK's otlptracehttp: its protobuf and gRPC
// packages cost every tailer process about 5 MB of memory at start,
// tracing on or off.
type otlpExporter struct {
	url     string
	headers http.Header
	gzip    bool
	timeout time.Duration
	client  *http.Client
}

// newOTLPExporter reads the exporter's OTEL_EXPORTER_OTLP_* variables:
// the endpoint (TRACES_ENDPOINT as is, or ENDPOINT plus /v1/traces),
// headers, timeout, compression (gzip or none) and CA certificate, each
// the traces-specific one first.
func newOTLPExporter(get func(string) string) (*otlpExporter, error) {
	either := func(name string) (string, string) {
		if v := get("OTEL_EXPORTER_OTLP_TRACES_" + name); v != "" {
			return v, "OTEL_EXPORTER_OTLP_TRACES_" + name
		}
		return get("OTEL_EXPORTER_OTLP_" + name), "OTEL_EXPORTER_OTLP_" + name
	}
	e := &otlpExporter{headers: http.Header{}, timeout: 10 * time.Second}
	if v := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); v != "" {
		e.url = v
	} else {
		e.url = strings.TrimRight(get("OTEL_EXPORTER_OTLP_ENDPOINT"), "/") + "/v1/traces"
	}
	if u, err := url.Parse(e.url); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL may carry credentials: its length, never itself.
		return nil, &config.Error{Var: "OTEL_EXPORTER_OTLP_ENDPOINT", Err: fmt.Errorf("want http(s)://host:port (a value of %d characters)", len(e.url))}
	}
	if v, name := either("PROTOCOL"); v != "" && v != "http/json" {
		return nil, &config.Error{Var: name, Err: fmt.Errorf("%q: the tailer sends http/json", v)}
	}
	if v, name := either("HEADERS"); v != "" {
		for pair := range strings.SplitSeq(v, ",") {
			k, val, ok := strings.Cut(pair, "=")
			k = strings.TrimSpace(k)
			dec, err := url.QueryUnescape(strings.TrimSpace(val))
			if !ok || k == "" || err != nil {
				// Header values are often tokens: named, never shown.
				return nil, &config.Error{Var: name, Err: fmt.Errorf("want key=value,... (percent-encoded values)")}
			}
			e.headers.Set(k, dec)
		}
	}
	if v, name := either("TIMEOUT"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return nil, &config.Error{Var: name, Err: fmt.Errorf("%q: want milliseconds", v)}
		}
		e.timeout = time.Duration(ms) * time.Millisecond
	}
	switch v, name := either("COMPRESSION"); v {
	case "", "none":
	case "gzip":
		e.gzip = true
	default:
		return nil, &config.Error{Var: name, Err: fmt.Errorf("%q: want gzip or none", v)}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if v, name := either("CERTIFICATE"); v != "" {
		pem, err := os.ReadFile(v)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return nil, &config.Error{Var: name, Err: fmt.Errorf("no PEM certificate in %s", v)}
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	e.client = &http.Client{Transport: transport}
	return e, nil
}

// ExportSpans implements sdktrace.SpanExporter.
func (e *otlpExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	body, err := json.Marshal(otlpRequest(spans))
	if err != nil {
		return err
	}
	if e.gzip {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write(body)
		w.Close()
		body = b.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = e.headers.Clone()
	req.Header.Set("Content-Type", "application/json")
	if e.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("export spans: %w", err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("export spans: the receiver answered %s", resp.Status)
	}
	return nil
}

// Shutdown implements sdktrace.SpanExporter.
func (e *otlpExporter) Shutdown(context.Context) error {
	e.client.CloseIdleConnections()
	return nil
}

// The OTLP/JSON encoding of an ExportTraceServiceRequest: ids in hex,
// 64-bit integers as strings, enums as numbers.
type (
	otlpKeyValue struct {
		Key   string         `json:"key"`
		Value map[string]any `json:"value"`
	}
	otlpSpan struct {
		TraceID      string         `json:"traceId"`
		SpanID       string         `json:"spanId"`
		ParentSpanID string         `json:"parentSpanId,omitempty"`
		Name         string         `json:"name"`
		Kind         int            `json:"kind"`
		Start        string         `json:"startTimeUnixNano"`
		End          string         `json:"endTimeUnixNano"`
		Attributes   []otlpKeyValue `json:"attributes,omitempty"`
		Status       map[string]any `json:"status,omitempty"`
	}
	otlpScopeSpans struct {
		Scope map[string]string `json:"scope"`
		Spans []otlpSpan        `json:"spans"`
	}
	otlpResourceSpans struct {
		Resource   map[string][]otlpKeyValue `json:"resource"`
		ScopeSpans []otlpScopeSpans          `json:"scopeSpans"`
	}
)

func otlpRequest(spans []sdktrace.ReadOnlySpan) map[string][]otlpResourceSpans {
	var out []otlpResourceSpans
	for _, s := range spans {
		if len(out) == 0 || out[len(out)-1].ScopeSpans[0].Scope["name"] != s.InstrumentationScope().Name {
			out = append(out, otlpResourceSpans{
				Resource:   map[string][]otlpKeyValue{"attributes": otlpAttributes(s.Resource().Attributes())},
				ScopeSpans: []otlpScopeSpans{{Scope: map[string]string{"name": s.InstrumentationScope().Name}}},
			})
		}
		sp := otlpSpan{
			TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
			Name: s.Name(), Kind: int(s.SpanKind()),
			Start: strconv.FormatInt(s.StartTime().UnixNano(), 10), End: strconv.FormatInt(s.EndTime().UnixNano(), 10),
			Attributes: otlpAttributes(s.Attributes()),
		}
		if p := s.Parent(); p.SpanID().IsValid() {
			sp.ParentSpanID = p.SpanID().String()
		}
		// OTLP's codes: 1 ok, 2 error (the Go API numbers them apart).
		switch st := s.Status(); st.Code {
		case codes.Error:
			sp.Status = map[string]any{"code": 2, "message": st.Description}
		case codes.Ok:
			sp.Status = map[string]any{"code": 1}
		}
		ss := &out[len(out)-1].ScopeSpans[0]
		ss.Spans = append(ss.Spans, sp)
	}
	return map[string][]otlpResourceSpans{"resourceSpans": out}
}

func otlpAttributes(kvs []attribute.KeyValue) []otlpKeyValue {
	out := make([]otlpKeyValue, 0, len(kvs))
	for _, kv := range kvs {
		var v map[string]any
		switch kv.Value.Type() {
		case attribute.BOOL:
			v = map[string]any{"boolValue": kv.Value.AsBool()}
		case attribute.INT64:
			v = map[string]any{"intValue": strconv.FormatInt(kv.Value.AsInt64(), 10)}
		case attribute.FLOAT64:
			v = map[string]any{"doubleValue": kv.Value.AsFloat64()}
		default:
			v = map[string]any{"stringValue": kv.Value.Emit()}
		}
		out = append(out, otlpKeyValue{Key: string(kv.Key), Value: v})
	}
	return out
}
