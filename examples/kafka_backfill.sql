-- The seed's backfill, from Kafka: every partition of `bids` read from the
-- earliest offset to the latest (a bounded backfill), each partition a
-- split with its own watermark. Partition 0's bids are a minute later in
-- event time than the others', so it runs ahead; the alignment group
-- pauses it (it is not polled, nothing fetched is dropped) whenever it is
-- more than 30 s of event time ahead of the slowest partition, and the
-- others keep flowing. SHOW WATERMARKS at the end lists each partition's
-- time paused: partition 0's, while the others read their first 30 s
-- and whenever it ran ahead again; the others' little or none (one of
-- them pauses when the other subtask falls more than 30 s behind it).
--
--   weir run examples/kafka_produce.sql     (fills the topic first)
--   weir run examples/kafka_backfill.sql

SET 'pipeline.name' = 'kafka-backfill';
SET 'table.dml-sync' = 'true';
SET 'pipeline.auto-watermark-interval' = '50 ms';

CREATE TABLE bids (
  region STRING, auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
    ALIGNMENT GROUP 'bids' MAX DRIFT INTERVAL '30' SECOND UPDATE INTERVAL '100' MILLISECOND
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
