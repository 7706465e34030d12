-- q2 shape: the bids of every 123rd auction.
CREATE TABLE bid (auction BIGINT, price BIGINT, `dateTime` TIMESTAMP(3),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;
