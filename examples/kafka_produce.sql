-- Fills the topic `bids` (4 partitions) for examples/kafka_backfill.sql:
-- 400 000 Nexmark bids keyed by a region, so that Kafka's partitioner
-- (murmur2, as the Java client) puts each region in its own partition.
-- Partition 0 ('red') holds one bid in eight and the three others the
-- rest, over the same 40 s of event time: read at the same pace,
-- partition 0 runs ahead in event time. The region comes from the price:
-- Nexmark's auction and bidder ids are skewed towards hot ones, so a
-- region by auction would not be one bid in eight.
--
--   tansu topic create bids --partitions 4 --broker tcp://127.0.0.1:9092
--   weir run examples/kafka_produce.sql

SET 'pipeline.name' = 'kafka-produce';
SET 'table.dml-sync' = 'true';

CREATE TABLE gen (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3))
WITH ('connector' = 'nexmark', 'nexmark.events' = '435000');

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
       auction, bidder, price, dateTime
FROM gen;
