-- The store's four trees, each an ordered map of byte keys to byte values (bytea compares
-- bytewise, so key order is the embedded engine's).
CREATE TABLE fleetops_records (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE fleetops_logs (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE fleetops_seq (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE fleetops_meta (k bytea PRIMARY KEY, v bytea NOT NULL);
