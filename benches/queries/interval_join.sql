-- An interval join over Nexmark events: each bid with its auction when bid within the auction's first 10 s (Flink's RowTimeIntervalJoin).
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${NEXMARK_BID}', 'format' = 'csv');
CREATE TABLE auction (id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT,
  `dateTime` TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${NEXMARK_AUCTION}', 'format' = 'csv');
CREATE TABLE person (id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING,
  `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${NEXMARK_PERSON}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT, bidder BIGINT, seller BIGINT, category BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT B.auction, B.price, B.bidder, A.seller, A.category
FROM bid B JOIN auction A ON B.auction = A.id
  AND B.`dateTime` BETWEEN A.`dateTime` AND A.`dateTime` + INTERVAL '10' SECOND;
