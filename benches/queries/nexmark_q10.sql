-- Nexmark q10 (Flink's Nexmark SQL: log bids to a partitioned file system
-- table by day and minute) over Weir's generated events. Run with
-- -D OUT=<a directory to write into>.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${NEXMARK_BID}', 'format' = 'csv');
CREATE TABLE fs_sink (auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra STRING, dt STRING, hm STRING)
  PARTITIONED BY (dt, hm) WITH (
  'connector' = 'filesystem', 'path' = '${OUT}', 'format' = 'csv',
  'sink.partition-commit.trigger' = 'partition-time', 'sink.partition-commit.delay' = '1 min',
  'sink.partition-commit.policy.kind' = 'success-file',
  'partition.time-extractor.timestamp-pattern' = '$dt $hm:00',
  'sink.rolling-policy.rollover-interval' = '1min', 'sink.rolling-policy.check-interval' = '1min');
INSERT INTO fs_sink SELECT auction, bidder, price, `dateTime`, extra,
  DATE_FORMAT(`dateTime`, 'yyyy-MM-dd'), DATE_FORMAT(`dateTime`, 'HH:mm') FROM bid;
