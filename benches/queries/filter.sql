-- q2 shape: the bids of every 123rd auction.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;
