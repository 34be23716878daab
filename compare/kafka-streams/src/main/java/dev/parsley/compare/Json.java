package dev.parsley.compare;

import java.io.IOException;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/** JSON serdes via Jackson. */
final class Json {
    private Json() {}

    private static final ObjectMapper MAPPER = new ObjectMapper()
            .configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false);

    /** A serde of {@code type} as JSON; {@code null} stays {@code null}. */
    static <T> Serde<T> serde(Class<T> type) {
        Serializer<T> serializer = (topic, value) -> {
            if (value == null) {
                return null;
            }
            try {
                return MAPPER.writeValueAsBytes(value);
            } catch (IOException e) {
                throw new SerializationException("encoding " + type.getSimpleName(), e);
            }
        };
        Deserializer<T> deserializer = (topic, bytes) -> {
            if (bytes == null) {
                return null;
            }
            try {
                return MAPPER.readValue(bytes, type);
            } catch (IOException e) {
                throw new SerializationException("decoding " + type.getSimpleName() + " from " + topic, e);
            }
        };
        return Serdes.serdeFrom(serializer, deserializer);
    }
}
