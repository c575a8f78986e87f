# Linker launcher of pipit_layer_check_<layer>: runs the link command given after "--" and,
# when it fails, says which layer references what no layer it may use defines.
# cmake -DLAYER=<layer> -DALLOWED=<layers, comma-separated> -P <this> -- <link command...>
cmake_minimum_required(VERSION 3.25)
set(command)
set(in_command FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(in_command)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(in_command TRUE)
  endif()
endforeach()

execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE output
                ERROR_VARIABLE output)
if(result EQUAL 0)
  if(output)
    message(NOTICE "${output}")
  endif()
  return()
endif()

string(REPLACE "," ", " allowed "${ALLOWED}")
if(NOT allowed)
  set(allowed "none")
endif()
# One line per unresolved reference: the source file, the function and the symbol. GNU ld
# names the object and function on the line before ("obj.o: in function `f':").
string(REPLACE ";" "\\;" output_escaped "${output}")
string(REPLACE "\n" ";" lines "${output_escaped}")
set(where "")
set(references)
foreach(line IN LISTS lines)
  if(line MATCHES ": ?([^: ]+\\.o): in function `(.*)':$")
    set(object ${CMAKE_MATCH_1})
    set(function ${CMAKE_MATCH_2})
    string(REGEX REPLACE "^.*CMakeFiles/[^/]+\\.dir/" "" object "${object}")
    string(REGEX REPLACE "\\.o$" "" object "${object}")
    set(where "${object}, in ${function}: ")
  elseif(line MATCHES "undefined reference to (.*)$")
    list(APPEND references "  ${where}${CMAKE_MATCH_1}")
  endif()
endforeach()
list(REMOVE_DUPLICATES references)
list(JOIN references "\n" references_text)
# Indented lines are printed as they are, not rewrapped.
string(STRIP "${output}" output_text)
string(REPLACE "\n" "\n  " output_text "  ${output_text}")
message(FATAL_ERROR
        "pipit layer check: layer ${LAYER} references symbols that neither it nor the layers "
        "it may use (${allowed}) define; a lower layer must not call into a higher one "
        "(docs/ARCHITECTURE.md, \"Layers\"). Define each in the layer that declares it, or "
        "declare it where it is defined. Undefined:\n${references_text}\n"
        "Linker output:\n${output_text}")
