package subscriber

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/jsio"
	"slices"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrTakenOver is returned by a ProgressStore when another subscriber
// saved the durable's record since this one read it: the other one is
// delivering now, and this one must stop.
var ErrTakenOver = errors.New("another subscriber saved progress for this durable consumer since this one read it")

// ProgressStore keeps a durable consumer's record (protocol.Progress). Save succeeds
// only if the record is still at the revision this subscriber last read or wrote.
type ProgressStore interface {
	Load(ctx context.Context) (p protocol.Progress, revision uint64, err error)
	Save(ctx context.Context, p *protocol.Progress, revision uint64) (uint64, error)
}

// KVProgress keeps the record in a JetStream key-value bucket, on the same
// servers as the stream, so that it survives the subscriber's host and is
// shared by the standby subscribers of a durable.
type KVProgress struct {
	b   RecordBucket
	key string
	// unsure are the records written since the last confirmed write whose
	// outcome is not known.
	unsure [][]byte
}

// RecordBucket is the one key of the records' bucket a KVProgress keeps:
// its value as the bucket's leader holds it (nil and revision 0: none;
// nil and the marker's revision: deleted), and a write that lands only on
// revision (0: none yet). A write refused because the key moved on wraps
// jetstream.ErrKeyRevisionMismatch or jetstream.ErrKeyExists; any other
// error leaves unknown whether it landed. The JetStream bucket is one;
// the simulation's model of it, with answers lost, is another.
type RecordBucket interface {
	Get(ctx context.Context) ([]byte, uint64, error)
	Put(ctx context.Context, value []byte, revision uint64) (uint64, error)
}

// NewKVProgress keeps the record of durable (key) in b.
func NewKVProgress(b RecordBucket, durable string) *KVProgress {
	return &KVProgress{b: b, key: safeName(durable)}
}

// JetStreamKey is durable's key of the records' bucket kv, read from the
// bucket's leader through js.
func JetStreamKey(kv jetstream.KeyValue, js jetstream.JetStream, durable string) RecordBucket {
	return jsKey{kv: kv, js: js, key: safeName(durable)}
}

// jsKey is a key of a JetStream bucket.
type jsKey struct {
	kv  jetstream.KeyValue
	js  jetstream.JetStream
	key string
}

// ProgressBucket is the bucket holding the records of stream's consumers.
func ProgressBucket(stream string) string { return safeName(stream) + "_subscribers" }

// OpenProgress opens (making it if missing, with the stream's replicas)
// the bucket of stream's subscriber records, for durable's record.
func OpenProgress(ctx context.Context, js jetstream.JetStream, stream, durable string) (*KVProgress, error) {
	bucket := ProgressBucket(stream)
	kv, err := untilAnswered(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return openBucket(ctx, js, stream, bucket) })
	if err != nil {
		return nil, fmt.Errorf("open key-value bucket %s (subscriber progress): %w", bucket, err)
	}
	return NewKVProgress(JetStreamKey(kv, js, durable), durable), nil
}

// ReadProgress reads durable's record as it is, making nothing: none
// (the zero Progress) when there is no bucket or no record.
func ReadProgress(ctx context.Context, js jetstream.JetStream, stream, durable string) (protocol.Progress, error) {
	kv, err := js.KeyValue(ctx, ProgressBucket(stream))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return protocol.Progress{}, nil
	}
	if err != nil {
		return protocol.Progress{}, fmt.Errorf("open key-value bucket %s (subscriber progress): %w", ProgressBucket(stream), err)
	}
	p, _, err := NewKVProgress(JetStreamKey(kv, js, durable), durable).Load(ctx)
	return p, err
}

// openBucket opens the bucket of stream's subscriber records, making it
// if missing.
func openBucket(ctx context.Context, js jetstream.JetStream, stream, bucket string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		replicas := 1
		if s, err := js.Stream(ctx, stream); err == nil {
			replicas = s.CachedInfo().Config.Replicas
		}
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "tailer subscribe: which batches of the messages in hand are done, per durable consumer",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	return kv, err
}

// safeName is name where it is a valid subject token and bucket name, its
// hex encoding (prefixed x-) where not.
func safeName(name string) string {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Sprintf("x-%x", name)
		}
	}
	return name
}

// ErrUnreadableProgress is a record that does not parse: reading it again
// does not help.
var ErrUnreadableProgress = errors.New("the progress record cannot be read")

// Load reads the record; revision 0 when there is none.
func (s *KVProgress) Load(ctx context.Context) (protocol.Progress, uint64, error) {
	value, rev, err := s.b.Get(ctx)
	if err != nil {
		return protocol.Progress{}, 0, fmt.Errorf("read progress of %s: %w", s.key, err)
	}
	if value == nil {
		// None, or deleted at revision rev (the next save updates that).
		return protocol.Progress{}, rev, nil
	}
	p, err := protocol.ParseProgress(value)
	if err != nil {
		return protocol.Progress{}, 0, fmt.Errorf("read progress of %s (revision %d): %w: %w", s.key, rev, ErrUnreadableProgress, err)
	}
	return p, rev, nil
}

// Get reads the record from the bucket's leader (jsio.GetMsg: not the
// key-value Get, which a follower behind its leader may answer; under load
// on a three-node cluster that made a subscriber take its own last write
// for another subscriber's, stop, and write a message's tokens again): no
// value and revision 0 when there is none, no value and the marker's
// revision when it was deleted or purged.
func (k jsKey) Get(ctx context.Context) ([]byte, uint64, error) {
	m, err := jsio.GetMsg(ctx, k.js.Conn(), "KV_"+k.kv.Bucket(), 0, "$KV."+k.kv.Bucket()+"."+k.key)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, err
	case m.Header.Get("KV-Operation") != "":
		return nil, m.Sequence, nil
	case m.Data == nil:
		// An empty record is a record.
		return []byte{}, m.Sequence, nil
	}
	return m.Data, m.Sequence, nil
}

// Save writes the record if it is still at revision (0: there is none),
// returning the new revision, or ErrTakenOver.
func (s *KVProgress) Save(ctx context.Context, p *protocol.Progress, revision uint64) (uint64, error) {
	// Written in this release's format, whatever the record read said:
	// the fields of a later one were dropped.
	rec := *p
	rec.Version, rec.Needs = 0, 0
	data, err := json.Marshal(&rec)
	if err != nil {
		return 0, fmt.Errorf("save progress of %s: %w", s.key, err)
	}
	for try := 0; ; try++ {
		rev, err := s.b.Put(ctx, data, revision)
		if err == nil {
			s.unsure = nil
			return rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			// Lost on its way or not: which, the next write finds out.
			s.unsure = append(s.unsure, data)
			if len(s.unsure) > maxUnsure {
				s.unsure = s.unsure[1:]
			}
			return 0, fmt.Errorf("save progress of %s: %w", s.key, err)
		}
		// The record moved on. If to something this subscriber wrote
		// without hearing back, it is still this subscriber's.
		value, rev, gerr := s.b.Get(ctx)
		if gerr != nil {
			// Not known either way: the next write finds out.
			return 0, fmt.Errorf("save progress of %s: read it back: %w", s.key, gerr)
		}
		if try >= maxUnsure {
			return 0, fmt.Errorf("save progress of %s at revision %d: %w", s.key, revision, ErrTakenOver)
		}
		// Only a write of its own that it did not hear back from: the same
		// bytes written by another subscriber are the other's record (a
		// subscriber frozen past the pin's TTL woke to find its record,
		// pruned to the ack floor, byte for byte the one that took over
		// had saved, claimed it, and wrote the message again; the
		// simulation found it once it wrote through this Save).
		if !slices.ContainsFunc(s.unsure, func(u []byte) bool { return bytes.Equal(value, u) }) {
			return 0, fmt.Errorf("save progress of %s at revision %d: %w", s.key, revision, ErrTakenOver)
		}
		if bytes.Equal(value, data) {
			s.unsure = nil
			return rev, nil
		}
		revision = rev
	}
}

// maxUnsure bounds the writes remembered whose outcome is not known. A
// bucket away for a while sees a save tried every second and before each
// ack: with 8 remembered, one that landed unheard was forgotten and taken
// for another subscriber's (issue 49's fault runs: a subscriber let go of
// a message of 142 batches and wrote it again).
const maxUnsure = 64

// Put writes the record at revision: made when there is none (Create
// also takes over a key left deleted), updated otherwise.
func (k jsKey) Put(ctx context.Context, data []byte, revision uint64) (uint64, error) {
	if revision == 0 {
		return k.kv.Create(ctx, k.key, data)
	}
	return k.kv.Update(ctx, k.key, data, revision)
}
