package publish

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mailroom/tailer/decoder"
)

// The tailer's spans, each a child of the traceparent an application
// wrote into the transaction of the tokens it covers (decoder.Token.Trace):
//
//	mailroom.decode   from the transaction's commit to the pipeline taking
//	                  its batch (the walsender, decoding, batching)
//	mailroom.join     the accounts query that joined the batch
//	mailroom.publish  the message's publish to its PubAck
//
// One of each per traceparent and batch (join) or message (publish), with
// the number of that trace's tokens: untraced tokens cost one comparison.
const (
	spanDecode  = "mailroom.decode"
	spanJoin    = "mailroom.join"
	spanPublish = "mailroom.publish"
)

// tracedTokens counts the tokens of each traceparent in batches, and the
// earliest commit of each.
type tracedTokens struct {
	order  []string
	count  map[string]int
	commit map[string]time.Time
}

func collectTraces(batches [][]decoder.Token) *tracedTokens {
	var tt *tracedTokens
	for _, tokens := range batches {
		for i := range tokens {
			t := &tokens[i]
			if t.Trace == "" {
				continue
			}
			if tt == nil {
				tt = &tracedTokens{count: map[string]int{}, commit: map[string]time.Time{}}
			}
			if _, ok := tt.count[t.Trace]; !ok {
				tt.order = append(tt.order, t.Trace)
				tt.commit[t.Trace] = t.Committed()
			}
			tt.count[t.Trace]++
		}
	}
	return tt
}

// parentContext is ctx with the remote span of traceparent tp as parent.
func parentContext(ctx context.Context, tp string) context.Context {
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

// traceDecodeAndJoin records the decode spans of group's traced tokens and
// starts their join spans; the returned function ends those.
func (p *Pipeline) traceDecodeAndJoin(ctx context.Context, batches [][]decoder.Token) func(error) {
	if p.Tracer == nil {
		return func(error) {}
	}
	tt := collectTraces(batches)
	if tt == nil {
		return func(error) {}
	}
	now := time.Now()
	spans := make([]trace.Span, 0, len(tt.order))
	for _, tp := range tt.order {
		parent := parentContext(ctx, tp)
		tokens := attribute.Int("mailroom.tokens", tt.count[tp])
		_, decode := p.Tracer.Start(parent, spanDecode, trace.WithTimestamp(tt.commit[tp]), trace.WithAttributes(tokens), trace.WithSpanKind(trace.SpanKindConsumer))
		decode.End(trace.WithTimestamp(now))
		_, join := p.Tracer.Start(parent, spanJoin, trace.WithTimestamp(now), trace.WithAttributes(tokens, attribute.String("db.system.name", "postgresql")), trace.WithSpanKind(trace.SpanKindClient))
		spans = append(spans, join)
	}
	return func(err error) { endSpans(spans, err) }
}

// tracePublish starts the publish spans of a message whose traced tokens
// are traces (Encoded.Traces) on subject.
func (p *Pipeline) tracePublish(traces []string, counts []int, subject string) []trace.Span {
	if p.Tracer == nil || len(traces) == 0 {
		return nil
	}
	spans := make([]trace.Span, len(traces))
	for i, tp := range traces {
		_, spans[i] = p.Tracer.Start(parentContext(context.Background(), tp), spanPublish, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.Int("mailroom.tokens", counts[i]), attribute.String("messaging.system", "nats"),
				attribute.String("messaging.destination.name", subject)))
	}
	return spans
}

// endSpans ends spans, marking them failed with err when there is one.
func endSpans(spans []trace.Span, err error, attrs ...attribute.KeyValue) {
	for _, s := range spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, err.Error())
		}
		s.SetAttributes(attrs...)
		s.End()
	}
}
