package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
)

// otlpReceiver is an OTLP/HTTP endpoint in the test's process: the spans
// the tailer exports, decoded by the OpenTelemetry Collector's own OTLP
// JSON decoder (pdata), as a collector would receive them.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []ptrace.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		traces, err := (&ptrace.JSONUnmarshaler{}).UnmarshalTraces(body)
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/json" || err != nil {
			http.Error(w, fmt.Sprintf("not an OTLP/JSON trace export: %v", err), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range traces.ResourceSpans().All() {
			if name, _ := rs.Resource().Attributes().Get("service.name"); name.Str() != "tailer" {
				t.Errorf("spans of service %q", name.Str())
			}
			for _, ss := range rs.ScopeSpans().All() {
				for _, s := range ss.Spans().All() {
					r.spans = append(r.spans, s)
				}
			}
		}
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte("{}"))
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// children returns the spans received whose parent is the span parent of
// trace traceID, by name.
func (r *otlpReceiver) children(traceID, parent string) map[string][]ptrace.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]ptrace.Span{}
	for _, s := range r.spans {
		if s.TraceID().String() == traceID && s.ParentSpanID().String() == parent {
			out[s.Name()] = append(out[s.Name()], s)
		}
	}
	return out
}

func (r *otlpReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.spans)
}

// A token written with a traceparent in its transaction: the message
// carries it as a traceparent header naming the token, the tailer's
// decode, join and publish spans are children of it, a subscriber gives it
// to its tokens, and a token without one is traced by nothing.
func TestTraceparent(t *testing.T) {
	t.Parallel()
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent  = "00f067aa0ba902b7"
		tp      = "00-" + traceID + "-" + parent + "-01"
	)
	recv := newOTLPReceiver(t)
	c := newCluster(t, pgtest.Shared(t), 10, 200*time.Millisecond)
	p := c.tailer("OTEL_EXPORTER_OTLP_ENDPOINT="+recv.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100")
	p.waitLog("msg=streaming", 1, 30*time.Second)

	// One transaction: an untraced token, the traceparent, two traced
	// tokens. Then an untraced transaction, and one with a malformed value.
	c.Exec(`BEGIN;
		INSERT INTO accounts (email, login) VALUES ('before@x', 'before');
		SELECT pg_logical_emit_message(true, 'mailroom_traceparent', '` + tp + `');
		INSERT INTO accounts (email, login) VALUES ('t1@x', 't1'), ('t2@x', 't2');
		COMMIT`)
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('plain@x', 'plain')`)
	c.Exec(`BEGIN;
		SELECT pg_logical_emit_message(true, 'mailroom_traceparent', '00-` + traceID + `-0000000000000000-01');
		INSERT INTO accounts (email, login) VALUES ('bad@x', 'bad');
		COMMIT`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 5 {
		t.Fatalf("%d tokens", n)
	}

	traced := map[string]string{}
	for _, m := range c.messages() {
		batch, err := subscriber.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Values(wire.HeaderTraceparent); len(got) > 0 && !slices.Equal(got, []string{tp}) {
			t.Errorf("message %d: traceparent headers %q, want [%s]", m.Sequence, got, tp)
		}
		for _, tok := range batch.Tokens {
			traced[tok.Email] = tok.Traceparent
		}
	}
	want := map[string]string{"before@x": "", "t1@x": tp, "t2@x": tp, "plain@x": "", "bad@x": ""}
	if !mapsEqual(traced, want) {
		t.Fatalf("tokens' traceparents %v, want %v", traced, want)
	}

	tailertest.Eventually(t, 30*time.Second, func() error {
		got := recv.children(traceID, parent)
		for _, name := range []string{"mailroom.decode", "mailroom.join", "mailroom.publish"} {
			if len(got[name]) == 0 {
				return fmt.Errorf("no %s span under the application's (%d spans received: %v)", name, recv.count(), got)
			}
		}
		return nil
	})
	for _, s := range recv.children(traceID, parent)["mailroom.publish"] {
		seq, _ := s.Attributes().Get("messaging.nats.stream_sequence")
		tokens, _ := s.Attributes().Get("mailroom.tokens")
		if seq.Int() <= 0 || tokens.Int() != 2 || s.Kind() != ptrace.SpanKindProducer || s.EndTimestamp() < s.StartTimestamp() {
			t.Errorf("publish span: stream sequence %d, tokens %d, kind %v; want a sequence, the trace's 2 tokens, producer", seq.Int(), tokens.Int(), s.Kind())
		}
	}
	if n := recv.count(); n != 3 {
		t.Errorf("%d spans received, want 3: only the traced transaction's", n)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
