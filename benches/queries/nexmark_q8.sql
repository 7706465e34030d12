-- Nexmark q8 (Flink's Nexmark SQL: persons who opened auctions in the same 10 s window; a window join) over Weir's generated events.
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
CREATE TABLE sink (id BIGINT, name STRING, stime TIMESTAMP(3)) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT P.id, P.name, P.starttime
FROM (
  SELECT P.id, P.name,
    TUMBLE_START(P.`dateTime`, INTERVAL '10' SECOND) AS starttime,
    TUMBLE_END(P.`dateTime`, INTERVAL '10' SECOND) AS endtime
  FROM person P
  GROUP BY P.id, P.name, TUMBLE(P.`dateTime`, INTERVAL '10' SECOND)
) P
JOIN (
  SELECT A.seller,
    TUMBLE_START(A.`dateTime`, INTERVAL '10' SECOND) AS starttime,
    TUMBLE_END(A.`dateTime`, INTERVAL '10' SECOND) AS endtime
  FROM auction A
  GROUP BY A.seller, TUMBLE(A.`dateTime`, INTERVAL '10' SECOND)
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime;
