package resync

import "log/slog"

// Log logs what the resync did, as msg.
func (r Report) Log(log *slog.Logger, msg string) {
	args := []any{"slot", r.Slot, "incarnation", r.Incarnation, "consistent_point", r.ConsistentPoint.String(), "eligible", r.Eligible,
		"already_on_stream", r.OnStream, "published", r.Published, "messages", r.Messages,
		"unsafe_field", r.Unsafe, "skipped", r.Skipped, "expired_unpublished", r.Expired, "set_aside", r.SetAside, "stream_seq", r.StreamSeq}
	if r.Cutover != nil {
		args = append(args, "collector_last_seq", r.Cutover.LastSeq)
	}
	log.Info(msg, args...)
}
