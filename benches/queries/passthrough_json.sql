-- Nexmark q0 over JSON lines (Flink's default format for Kafka): the bids
-- of passthrough.sql, one JSON object per line.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '5' SECOND
) WITH ('connector' = 'filesystem', 'path' = '${BIDS_JSON}', 'format' = 'json');
CREATE TABLE sink (auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra STRING) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, bidder, price, `dateTime`, extra FROM bid;
