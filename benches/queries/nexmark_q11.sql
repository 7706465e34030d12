-- Nexmark q11 (Flink's Nexmark SQL: bids per bidder session) over Weir's generated events.
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
CREATE TABLE sink (bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT B.bidder, COUNT(*) AS bid_count,
  SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) AS starttime,
  SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) AS endtime
FROM bid B GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND);
