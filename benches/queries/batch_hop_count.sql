-- Batch mode ('execution.runtime-mode' = 'batch') of hop_count.sql: the same rows, final results once.
SET 'execution.runtime-mode' = 'batch';
-- q5's inner query over many keys: bids per auction in 10 s windows every 2 s.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3), cnt BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, window_start, window_end, COUNT(*)
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;
