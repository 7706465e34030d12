-- Checkpoint benchmark (issue 3): a keyed window whose state only grows
-- (one-day windows over ~10 minutes of event time), ~1.3 GB in RocksDB
-- at the end. Run by benches/checkpoint.sh with the release binary.
SET 'parallelism.default' = '2';
SET 'pipeline.name' = 'bench-checkpoint';
CREATE TABLE bid (auction BIGINT, bidder BIGINT, dateTime TIMESTAMP(3), extra STRING,
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '${EVENTS}');
CREATE TABLE sink (auction BIGINT, bidder BIGINT, extra STRING, n BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink
SELECT auction, bidder, MAX(CONCAT(extra, extra, extra, extra)), COUNT(*)
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' DAY))
GROUP BY auction, bidder, window_start, window_end;
