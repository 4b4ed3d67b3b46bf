// The relay's protocol floor on the JVM (bench/relay_floor.py says why it exists): the Kafka work
// every relay of the half-message protocol does, through Kafka's own Java client, and nothing
// else. Read every half and op record (read_committed), write each half record to the real topic
// with its key and the transaction id the benchmark's watcher counts by, and commit each poll in
// one Kafka transaction with the offsets read. It decodes nothing and matches no op to its half
// records. Run from source, no build (java -cp <Kafka's jars> RelayFloor.java BOOTSTRAP PREFIX
// GROUP REAL_TOPIC); SIGTERM ends it.

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class RelayFloor {
  public static void main(String[] args) {
    String bootstrap = args[0], prefix = args[1], group = args[2], real = args[3];
    String half = prefix + "-half", op = prefix + "-op";
    // the relay's own settings (relay/clients.py): linger 5 ms, big batches, one poll of up to
    // 5,000 records per Kafka transaction
    Properties p = new Properties();
    p.put("bootstrap.servers", bootstrap);
    p.put("transactional.id", group + "-floor");
    p.put("enable.idempotence", "true");
    p.put("acks", "all");
    p.put("linger.ms", "5");
    p.put("batch.size", "1048576");
    p.put("key.serializer", ByteArraySerializer.class.getName());
    p.put("value.serializer", ByteArraySerializer.class.getName());
    Properties c = new Properties();
    c.put("bootstrap.servers", bootstrap);
    c.put("group.id", group);
    c.put("isolation.level", "read_committed");
    c.put("auto.offset.reset", "earliest"); // a fresh group, so from the start
    c.put("enable.auto.commit", "false");
    c.put("max.poll.records", "5000");
    c.put("partition.assignment.strategy", "org.apache.kafka.clients.consumer.RangeAssignor");
    c.put("key.deserializer", ByteArrayDeserializer.class.getName());
    c.put("value.deserializer", ByteArrayDeserializer.class.getName());
    KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
    KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c);
    producer.initTransactions();
    consumer.subscribe(List.of(half, op));
    while (true) {
      ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(10));
      if (records.isEmpty()) {
        continue;
      }
      producer.beginTransaction();
      Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
      for (ConsumerRecord<byte[], byte[]> record : records) {
        offsets.put(
            new TopicPartition(record.topic(), record.partition()),
            new OffsetAndMetadata(record.offset() + 1));
        if (!record.topic().equals(half)) {
          continue; // an op record: read, as every relay must, and nothing more here
        }
        Header key = record.headers().lastHeader("outbox-real-key");
        RecordHeaders headers = new RecordHeaders();
        headers.add("outbox-txn-id", record.key());
        producer.send(
            new ProducerRecord<>(real, null, key == null ? null : key.value(), record.value(), headers));
      }
      producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
      producer.commitTransaction();
    }
  }
}
