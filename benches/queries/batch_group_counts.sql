-- Batch mode ('execution.runtime-mode' = 'batch') of group_counts.sql: the same rows, final results once.
SET 'execution.runtime-mode' = 'batch';
-- q15/q17's shape over many keys: a non-windowed GROUP BY per auction
-- (10 000 keys) with COUNT, FILTER, COUNT DISTINCT, MIN/MAX/AVG/SUM: an
-- updating result, every change sent on.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, total BIGINT, cheap BIGINT, prices BIGINT, lo BIGINT, hi BIGINT, av BIGINT, s BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, COUNT(*), COUNT(*) FILTER (WHERE price < 1000), COUNT(DISTINCT price),
  MIN(price), MAX(price), AVG(price), SUM(price)
FROM bid GROUP BY auction;
