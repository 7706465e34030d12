-- The seed's backfill, from Kafka: every partition of `bids` read from the
-- earliest offset to the latest (a bounded backfill), each partition a
-- split with its own watermark. Partition 0 holds few bids per second of
-- event time, so it runs ahead; the alignment group pauses it (it is not
-- polled, nothing fetched is dropped) whenever it is more than 5 s of
-- event time ahead of the slowest partition, and the others keep flowing
-- (a small drift: the topic holds 40 s of event time).
-- SHOW WATERMARKS at the end lists each partition's time paused: partition
-- 0's, a few hundred milliseconds (how much depends on how fast the broker
-- serves the read); the others', none.
--
--   weir run examples/kafka_produce.sql     (fills the topic first)
--   weir run examples/kafka_backfill.sql

SET 'pipeline.name' = 'kafka-backfill';
SET 'table.dml-sync' = 'true';
SET 'pipeline.auto-watermark-interval' = '50 ms';

CREATE TABLE bids (
  region STRING, auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
    ALIGNMENT GROUP 'bids' MAX DRIFT INTERVAL '5' SECOND UPDATE INTERVAL '100' MILLISECOND
) WITH (
  'connector' = 'kafka',
  'topic' = 'bids',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'properties.group.id' = 'weir-backfill',
  'format' = 'json',
  'scan.startup.mode' = 'earliest-offset',
  'scan.bounded.mode' = 'latest-offset',
  -- Small fetches: each poll hands on a few hundred bids per partition, so
  -- the partitions interleave finely (the default fetches megabytes).
  'properties.max.partition.fetch.bytes' = '32768'
);

CREATE TABLE per_region (region STRING, bids BIGINT, window_end TIMESTAMP(3)) WITH ('connector' = 'blackhole');

INSERT INTO per_region
SELECT region, COUNT(*), window_end
FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
GROUP BY region, window_start, window_end;

-- Per partition (split `bids:N`): final watermark, offset, and time paused
-- by alignment.
SHOW WATERMARKS FOR JOB 'kafka-backfill';
