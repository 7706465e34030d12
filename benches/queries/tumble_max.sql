-- q7's inner query: the highest price of every 10 s.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (window_start TIMESTAMP(3), window_end TIMESTAMP(3), maxprice BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT window_start, window_end, MAX(price)
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
GROUP BY window_start, window_end;
