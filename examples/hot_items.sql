-- Nexmark q5-style "hot items": bids per auction in 10-second windows
-- sliding every 2 seconds, keeping auctions with more than 200 bids in a
-- window. A keyed HOP window: state in RocksDB, hash exchange by auction.
--
--   weir run examples/hot_items.sql

SET 'pipeline.name' = 'hot-items';
SET 'parallelism.default' = '2';

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '500000');

CREATE TABLE hot (auction BIGINT, bids BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3))
WITH ('connector' = 'print');

INSERT INTO hot
SELECT auction, COUNT(*) AS bids, window_start, window_end
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end
HAVING COUNT(*) > 200;
