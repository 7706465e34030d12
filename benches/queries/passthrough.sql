-- q0 shape: every bid passes through unchanged.
CREATE TABLE bid (auction BIGINT, price BIGINT, `dateTime` TIMESTAMP(3),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT, `dateTime` TIMESTAMP(3)) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, price, `dateTime` FROM bid;
