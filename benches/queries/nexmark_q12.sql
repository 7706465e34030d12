-- Nexmark q12 (Flink's Nexmark SQL: bids per bidder in 10 s processing-time
-- windows) over Weir's generated events.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${NEXMARK_BID}', 'format' = 'csv');
CREATE TABLE sink (bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT B.bidder, COUNT(*) AS bid_count,
  TUMBLE_START(B.p_time, INTERVAL '10' SECOND) AS starttime,
  TUMBLE_END(B.p_time, INTERVAL '10' SECOND) AS endtime
FROM (SELECT *, PROCTIME() AS p_time FROM bid) B
GROUP BY B.bidder, TUMBLE(B.p_time, INTERVAL '10' SECOND);
