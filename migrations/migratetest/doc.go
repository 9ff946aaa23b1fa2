// Package migratetest gives a test a mailroom database of its own, migrated
// by this module's migrations, with the questions tests ask it (WAL and
// slot positions).
//
// Test support, beside migrations: production code never imports it; the
// server comes from internal/testutil/pgtest.
package migratetest
