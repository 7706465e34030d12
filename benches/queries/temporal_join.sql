-- An event-time temporal join over Nexmark events: each bid enriched with its auction as of the bid's time (the auctions as a versioned table keyed by id; Flink's TemporalRowTimeJoinOperator).
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${NEXMARK_BID}', 'format' = 'csv');
CREATE TABLE auction (id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT,
  `dateTime` TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('connector' = 'filesystem', 'path' = '${NEXMARK_AUCTION}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT, bidder BIGINT, seller BIGINT, category BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT B.auction, B.price, B.bidder, A.seller, A.category
FROM bid B JOIN auction FOR SYSTEM_TIME AS OF B.`dateTime` AS A ON B.auction = A.id;
