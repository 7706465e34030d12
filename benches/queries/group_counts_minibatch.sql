-- group_counts.sql with Flink's mini-batch on both engines (bundles of up to
-- 5 000 rows, 2 s latency): a key's changes in a bundle are one update.
SET 'table.exec.mini-batch.enabled' = 'true';
SET 'table.exec.mini-batch.allow-latency' = '2 s';
SET 'table.exec.mini-batch.size' = '5000';
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, total BIGINT, cheap BIGINT, prices BIGINT, lo BIGINT, hi BIGINT, av BIGINT, s BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, COUNT(*), COUNT(*) FILTER (WHERE price < 1000), COUNT(DISTINCT price),
  MIN(price), MAX(price), AVG(price), SUM(price)
FROM bid GROUP BY auction;
