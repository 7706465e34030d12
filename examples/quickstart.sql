-- Weir quickstart: Nexmark bids from the built-in generator, counted per
-- 10-second tumbling window of event time. Bounded (1 million events, about
-- 100 seconds of event time), so the job ends by itself after printing its
-- windows.
--
--   weir run examples/quickstart.sql

SET 'pipeline.name' = 'quickstart';

CREATE TABLE bid (
  auction  BIGINT,
  bidder   BIGINT,
  price    BIGINT,
  channel  STRING,
  url      STRING,
  dateTime TIMESTAMP(3),
  extra    STRING,
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'nexmark.table' = 'bid',
  'nexmark.events' = '1000000'
);

CREATE TABLE bids_per_window (
  window_start TIMESTAMP(3),
  window_end   TIMESTAMP(3),
  bids         BIGINT,
  max_price    BIGINT,
  bidders      BIGINT
) WITH ('connector' = 'print');

INSERT INTO bids_per_window
SELECT window_start, window_end, COUNT(*), MAX(price), COUNT(DISTINCT bidder)
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
GROUP BY window_start, window_end;
