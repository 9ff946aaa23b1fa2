package replication

// What the slot's record keeps for tailer audit: a heal asked of the
// tailer that holds the slot, what the audits found missing, and how far
// tailer run's audits reached.

import (
	"context"
	"fmt"
	"time"
)

// AskHeal asks the tailer run that streams from slot to let go of its
// lease for a while (HealAsked), for a tailer audit --heal; ClearHeal
// says the heal is done. A request not cleared lapses after a minute.
func AskHeal(ctx context.Context, db SchemaConn, slot string) error {
	if _, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET heal_asked_at = now() WHERE slot = $1`, slot); err != nil {
		return fmt.Errorf("ask the tailer run of slot %s for its lease: %w", slot, err)
	}
	return nil
}

// ClearHeal clears AskHeal's request.
func ClearHeal(ctx context.Context, db SchemaConn, slot string) error {
	if _, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET heal_asked_at = NULL WHERE slot = $1`, slot); err != nil {
		return fmt.Errorf("clear the heal request of slot %s: %w", slot, err)
	}
	return nil
}

// AddAuditMissing adds ids to what an audit found missing from the
// stream (for tailer status and tailer run's /readyz), keeping the first
// thousand ids and the count of all; a token already named is not counted
// again. It returns how many are missing then.
func AddAuditMissing(ctx context.Context, db SchemaConn, slot string, ids []int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `WITH listed AS (
			SELECT coalesce(string_to_array(nullif(audit_missing, ''), ',')::bigint[], '{}') AS ids, coalesce(audit_missing_count, 0) AS n
			FROM `+db.slots()+` WHERE slot = $1),
		added AS (
			SELECT array_agg(id ORDER BY id) AS ids FROM (SELECT DISTINCT unnest($2::bigint[]) AS id) a, listed WHERE NOT a.id = ANY(listed.ids))
		UPDATE `+db.slots()+` s SET
			audit_missing = array_to_string((listed.ids || coalesce(added.ids, '{}'))[1:1000], ','),
			audit_missing_count = listed.n + coalesce(cardinality(added.ids), 0),
			audit_missing_at = coalesce(s.audit_missing_at, now())
		FROM listed, added WHERE s.slot = $1
		RETURNING s.audit_missing_count`, slot, ids).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("record what the audit of slot %s found missing: %w", slot, err)
	}
	return n, nil
}

// SetAuditThrough records how far tailer run's audit got.
func SetAuditThrough(ctx context.Context, db SchemaConn, slot string, through time.Time) error {
	if _, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET audit_through = $2 WHERE slot = $1`, slot, through); err != nil {
		return fmt.Errorf("record how far the audit of slot %s got: %w", slot, err)
	}
	return nil
}

// RemoveAuditMissing takes ids, healed, out of what audits found
// missing. Of the tokens past the first thousand, which are counted but
// not listed, those of ids not listed are taken for healed.
func RemoveAuditMissing(ctx context.Context, db SchemaConn, slot string, ids []int64) error {
	_, err := db.Exec(ctx, `WITH listed AS (
			SELECT coalesce(string_to_array(nullif(audit_missing, ''), ',')::bigint[], '{}') AS ids, coalesce(audit_missing_count, 0) AS n
			FROM `+db.slots()+` WHERE slot = $1),
		left_ AS (
			SELECT ARRAY(SELECT x FROM unnest(listed.ids) x WHERE NOT x = ANY($2::bigint[])) AS ids,
				listed.n - cardinality(listed.ids) AS unlisted,
				cardinality(ARRAY(SELECT DISTINCT x FROM unnest($2::bigint[]) x WHERE NOT x = ANY(listed.ids))) AS healed_unlisted
			FROM listed),
		counted AS (SELECT ids, cardinality(ids) + greatest(unlisted - healed_unlisted, 0) AS n FROM left_)
		UPDATE `+db.slots()+` s SET audit_missing = nullif(array_to_string(counted.ids, ','), ''),
			audit_missing_count = nullif(counted.n, 0),
			audit_missing_at = CASE WHEN counted.n = 0 THEN NULL ELSE s.audit_missing_at END
		FROM counted WHERE s.slot = $1`, slot, ids)
	if err != nil {
		return fmt.Errorf("take what was healed out of what the audit of slot %s found missing: %w", slot, err)
	}
	return nil
}

// ClearAuditMissing clears what audits found missing: healed, or
// acknowledged by the operator.
func ClearAuditMissing(ctx context.Context, db SchemaConn, slot string) error {
	_, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET audit_missing = NULL, audit_missing_count = NULL, audit_missing_at = NULL WHERE slot = $1`, slot)
	if err != nil {
		return fmt.Errorf("clear what the audit of slot %s found missing: %w", slot, err)
	}
	return nil
}
