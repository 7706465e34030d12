-- Fills the topic `bids` (4 partitions) for examples/kafka_backfill.sql:
-- 920 000 Nexmark bids (100 s of event time) keyed by a region, so that Kafka's partitioner
-- (murmur2, as the Java client) puts each region in its own partition.
-- Partition 0 ('red', one bid in eight: the region comes from the price,
-- as Nexmark's auction and bidder ids are skewed towards hot ones) is
-- stamped a minute later than the others, as from a clock a minute
-- ahead: read from the start like the rest, it runs a minute ahead in
-- event time.
--
--   tansu topic create bids --partitions 4 --broker tcp://127.0.0.1:9092
--   weir run examples/kafka_produce.sql

SET 'pipeline.name' = 'kafka-produce';
SET 'table.dml-sync' = 'true';

CREATE TABLE gen (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3))
WITH ('connector' = 'nexmark', 'nexmark.events' = '1000000');

CREATE TABLE bids_topic (region STRING, auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3))
WITH (
  'connector' = 'kafka',
  'topic' = 'bids',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'format' = 'json',
  'key.format' = 'raw',
  'key.fields' = 'region'
);

INSERT INTO bids_topic
SELECT CASE
         WHEN MOD(price, 8) = 0 THEN 'red'      -- partition 0
         WHEN MOD(price, 3) = 0 THEN 'west'     -- partition 1
         WHEN MOD(price, 3) = 1 THEN 'north'    -- partition 2
         ELSE 'south'                           -- partition 3
       END,
       auction, bidder, price,
       CASE WHEN MOD(price, 8) = 0 THEN dateTime + INTERVAL '1' MINUTE ELSE dateTime END
FROM gen;
