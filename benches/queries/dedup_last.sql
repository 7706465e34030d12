-- q18's shape: the last bid of every auction by event time
-- (deduplication keeping the last row).
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT, `dateTime` TIMESTAMP(3)) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, price, `dateTime` FROM (
  SELECT auction, price, `dateTime`, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY `dateTime` DESC) AS rn FROM bid
) WHERE rn = 1;
